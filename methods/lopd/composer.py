"""The latent composer Φ_φ and the latent-conditioned frozen teacher (methods.md, LOPD items 2-3).

``LatentComposer`` holds one frozen copy of the warm-start policy and two
trainable parts, φ:

* a **LoRA adapter** on that copy (peft; r=8, α=16 on the attention and MLP
  projections), active when the composer *reads* experience;
* a **Q-Former** (:class:`QFormer`, Perceiver-style): K learned queries
  (init randn/√d), a stack of cross-attention blocks with shared weights whose
  keys/values are [hidden states; current latents], a ×4 feed-forward, an
  output projection and a LayerNorm.

For each retrieved trajectory m_j of a task x it encodes
``"Task to solve:\\n{x}\\n\\nReference past trajectory:\\n{m_j}"`` (the reference's ``task_prefix``) with backbone +
LoRA, where m_j is the whole retrieved item, its own task text followed by its
action -> result trace (:meth:`Experience.document`; the reference serialises
the whole retrieved conversation, instruction included), takes the last hidden
states and compresses them into K vectors of the backbone's embedding width;
J items give the J·K latents ``c_φ``.  The latents are written at the scale of
the backbone's token embeddings (``latent_rms``; the reference's are unit-scale,
so the anchor divides by it: :func:`methods.lopd.margin.anchor_penalty`).

The **teacher** is the same frozen copy with the LoRA switched off: its first
user message holds a span of ``<|latent|>`` placeholder tokens (one per latent,
in the neutral context slot every method shares,
:func:`tasks.base.render_user_message`), whose input embeddings are replaced by
``c_φ`` (``inputs_embeds``), so the teacher's log-likelihoods are
differentiable in φ while its own weights never change.  The student never sees
latents or retrieved text.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from methods.core.rollout import initial_prompt_ids, trajectory_ids
from methods.core.tokenizer import LATENT

__all__ = ["QFormer", "LatentComposer", "action_tail", "item_text", "LORA_TARGETS"]

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def action_tail(encoder, domain, task, turns) -> tuple[list[int], list[int]]:
    """``turns`` of ``task`` as the teacher reads them after its first prompt: (token ids, agent
    mask), the tail :meth:`LatentComposer.teacher_sequence` puts behind the latent span."""
    ids, mask = trajectory_ids(encoder, domain, task, None, turns)
    start = len(initial_prompt_ids(encoder, domain, task, None))
    return ids[start:], mask[start:]


def item_text(task_prompt: str, item) -> str:
    """What the composer reads for one retrieved item (an :class:`~methods.experience.bank.Experience`,
    or its text): the reference's template, the query task first, then the whole retrieved
    trajectory with its own task text (``Experience.document()``)."""
    doc = item if isinstance(item, str) else item.document()
    return f"Task to solve:\n{task_prompt.rstrip()}\n\nReference past trajectory:\n{doc}"


class QFormer(nn.Module):
    """K learned queries cross-attending (shared weights, ``n_layers`` times) to hidden states.

    ``forward(hidden [B, T, d], mask [B, T]) -> [B, K, d_out]``.  Keys/values of
    each block are the concatenation of the (normed) hidden states and the
    current latents, so the latents also attend to each other.
    """

    def __init__(
        self,
        d: int,
        d_out: int,
        n_queries: int,
        n_layers: int = 2,
        n_heads: int = 4,
        ff_mult: int = 4,
        out_scale: float = 1.0,
    ):
        super().__init__()
        if d % n_heads:
            raise ValueError(f"Q-Former width {d} is not divisible by {n_heads} heads")
        self.n_layers = n_layers
        self.queries = nn.Parameter(torch.randn(n_queries, d) / math.sqrt(d))
        self.norm_q = nn.LayerNorm(d)
        self.norm_kv = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, n_heads, batch_first=True)
        self.norm_ff = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, ff_mult * d), nn.GELU(), nn.Linear(ff_mult * d, d))
        self.proj = nn.Linear(d, d_out)
        self.norm_out = nn.LayerNorm(d_out)
        with torch.no_grad():  # start the latents at the scale of the backbone's token embeddings
            self.norm_out.weight.fill_(out_scale)

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B = hidden.shape[0]
        lat = self.queries.unsqueeze(0).expand(B, -1, -1)
        kv_h = self.norm_kv(hidden)
        pad = torch.cat([~mask.bool(), mask.new_zeros(B, lat.shape[1], dtype=torch.bool)], dim=1)
        for _ in range(self.n_layers):  # the same block applied n_layers times (shared weights)
            q = self.norm_q(lat)
            kv = torch.cat([kv_h, q], dim=1)
            lat = lat + self.attn(q, kv, kv, key_padding_mask=pad, need_weights=False)[0]
            lat = lat + self.ff(self.norm_ff(lat))
        return self.norm_out(self.proj(lat))


def placeholder_id(tok) -> int:
    """The id of the teacher's latent placeholder (``<|latent|>``) in ``tok``.  The suite's own
    tokenizers carry it; a pretrained model's (SmolLM2's) does not, and gets it here as an added
    special token, the tokenizer only: its id may then lie past the model's embedding table, which the
    teacher's forward never looks it up in (the latents replace those positions), and the student,
    whose prompts never hold it, can neither see nor sample it."""
    from transformers import AddedToken

    tid = tok.convert_tokens_to_ids(LATENT)
    if tid is None or tid == tok.unk_token_id:
        tok.add_tokens([AddedToken(LATENT, special=True, normalized=False)], special_tokens=True)
        tid = tok.convert_tokens_to_ids(LATENT)
    return tid


class LatentComposer(nn.Module):
    """Frozen warm-start copy + LoRA + Q-Former; composes latents and runs the latent-conditioned teacher."""

    def __init__(
        self,
        backbone,
        encoder,
        n_latents: int = 32,
        qformer_layers: int = 2,
        qformer_heads: int = 4,
        lora_r: int = 8,
        lora_alpha: int = 16,
        max_item_tokens: int = 512,
    ):
        super().__init__()
        from peft import LoraConfig, get_peft_model

        backbone.requires_grad_(False)
        lora = LoraConfig(r=lora_r, lora_alpha=lora_alpha, lora_dropout=0.0, target_modules=LORA_TARGETS, bias="none")
        self.model = get_peft_model(backbone, lora)
        self.encoder = encoder
        self.n_latents, self.max_item_tokens = n_latents, max_item_tokens
        d = backbone.config.hidden_size
        emb = backbone.get_input_embeddings().weight
        rms = float(emb.detach().pow(2).mean().sqrt())
        self.latent_rms = rms  # the latents' scale (the reference's are unit-scale)
        self.qformer = QFormer(d, d, n_latents, qformer_layers, qformer_heads, out_scale=rms)
        self.latent_id = placeholder_id(encoder.tok)
        self.model.eval()  # no dropout anywhere; the frozen backbone is never in training mode
        self.phi_names = [n for n, p in self.named_parameters() if p.requires_grad]  # LoRA + Q-Former

    # --- φ ---------------------------------------------------------------------
    def trainable_state(self) -> dict[str, torch.Tensor]:
        """φ: the LoRA and Q-Former parameters (what a checkpoint and the anchor hold)."""
        params = dict(self.named_parameters())
        return {n: params[n] for n in self.phi_names}

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        own = self.trainable_state()
        if set(state) != set(own):
            raise ValueError(
                f"composer state mismatch: missing {sorted(set(own) - set(state))[:3]}, "
                f"unexpected {sorted(set(state) - set(own))[:3]}"
            )
        with torch.no_grad():
            for n, p in own.items():
                p.copy_(state[n])

    @property
    def backbone(self):
        """The frozen causal LM (the teacher's weights)."""
        return self.model.get_base_model()

    # --- composing -------------------------------------------------------------
    def encode_items(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encoder.encode(t)[: self.max_item_tokens] for t in texts]

    def forward(self, item_ids: Sequence[Sequence[int]], chunk_items: int = 8) -> torch.Tensor:
        """Latents [n_items, K, d] of tokenised items (LoRA on).

        Items are encoded in chunks of ``chunk_items`` of similar length (sorted by
        length).  On CPU small chunks are much faster than one batch of all items
        (their activations stay in cache; ``benchmarks/bench_composer_chunks.py``),
        and sorting keeps padding low.  The result is in the input order and does
        not depend on the chunking (padding is masked)."""
        order = sorted(range(len(item_ids)), key=lambda i: len(item_ids[i]))
        parts = [
            self._encode([item_ids[i] for i in order[s : s + chunk_items]]) for s in range(0, len(order), chunk_items)
        ]
        lat = torch.cat(parts)
        inverse = torch.empty(len(order), dtype=torch.long, device=lat.device)
        inverse[torch.tensor(order, device=lat.device)] = torch.arange(len(order), device=lat.device)
        return lat[inverse]

    def _encode(self, item_ids: Sequence[Sequence[int]]) -> torch.Tensor:
        dev = self.qformer.queries.device
        width = max(len(x) for x in item_ids)
        ids = torch.full((len(item_ids), width), self.encoder.pad_id, dtype=torch.long, device=dev)
        attn = torch.zeros_like(ids)
        for i, x in enumerate(item_ids):
            ids[i, : len(x)] = torch.tensor(x, device=dev)
            attn[i, : len(x)] = 1
        hidden = self.backbone.base_model(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state
        return self.qformer(hidden, attn)

    def compose(self, task_prompts: Sequence[str], hits) -> tuple[list[torch.Tensor], torch.Tensor, list[list[int]]]:
        """Latents for tasks and their retrieved items: per task [len(hits)·K, d], all items [items, K, d],
        and the item ids."""
        ids = self.encode_items([item_text(p, e) for p, hs in zip(task_prompts, hits) for e in hs])
        lat = self(ids)
        return list(torch.split(lat.flatten(0, 1), [len(h) * self.n_latents for h in hits])), lat, ids

    # --- the teacher -----------------------------------------------------------
    def teacher_sequence(
        self, domain, task, n_latents: int, tail_ids: Sequence[int], tail_mask: Sequence[int]
    ) -> tuple[list[int], list[int], int]:
        """A trajectory re-rendered for the teacher: ``n_latents`` placeholders in the context slot.

        Returns ``(ids, agent_mask, span_start)``; the latents go to positions
        ``span_start .. span_start + n_latents`` (by position: a sampled token may
        happen to be the placeholder id)."""
        prefix = initial_prompt_ids(self.encoder, domain, task, LATENT if n_latents else None)
        at = len(prefix)
        if n_latents:
            at = prefix.index(self.latent_id)
            prefix = prefix[:at] + [self.latent_id] * n_latents + prefix[at + 1 :]
        return prefix + list(tail_ids), [0] * len(prefix) + list(tail_mask), at

    def teacher_logits(
        self,
        ids: torch.Tensor,
        attn: torch.Tensor,
        mask: torch.Tensor,
        latents: Sequence[torch.Tensor],
        starts: Sequence[int],
    ) -> torch.Tensor:
        """Frozen teacher (LoRA off) logits [n, V] at the positions where ``mask`` [B, T-1] is 1.

        ``latents[b]`` [n_b, d] replaces the input embeddings of row b at positions
        ``starts[b] .. starts[b] + n_b`` (the placeholder span of
        :meth:`teacher_sequence`); gradients flow to the latents, never to the backbone."""
        base = self.backbone
        where = torch.zeros_like(ids, dtype=torch.bool)
        for b, (x, s0) in enumerate(zip(latents, starts)):
            where[b, s0 : s0 + x.shape[0]] = True
        if not bool((ids[where] == self.latent_id).all()) or int(where.sum()) != sum(int(x.shape[0]) for x in latents):
            raise ValueError("the latents do not line up with the teacher sequences' placeholder spans")
        # the placeholder's own embedding is never read (its id may lie past the table: placeholder_id)
        embeds = base.get_input_embeddings()(ids.masked_fill(where, 0))
        if int(where.sum()):
            embeds = embeds.masked_scatter(
                where.unsqueeze(-1), torch.cat([x for x in latents if x.shape[0]]).to(embeds.dtype)
            )
        with self.model.disable_adapter():
            hidden = base.base_model(inputs_embeds=embeds, attention_mask=attn, use_cache=False).last_hidden_state[
                :, :-1
            ]
            return base.get_output_embeddings()(hidden[mask.bool()]).float()
