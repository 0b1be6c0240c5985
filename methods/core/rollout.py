"""Batched multi-turn rollouts with a KV cache kept across turns.

``sample`` decodes a batch of left-padded prompts token by token with a
KV cache (one forward over the prompt, then one token per step), and
stops a row at ``<|im_end|>``.  ``run_episodes`` drives many episodes at once:
every turn, the still-running episodes are decoded together, their actions are
stepped through the domain (in parallel where the domain supports it), and the
observations are appended as ``tool`` messages before the next turn.  The
cache survives between turns (:class:`_Batch`): a new turn feeds only the
observation's tokens, finished episodes are dropped from the batch, and the
padding that ragged turns leave in the cache is squeezed out once per turn.

Each finished episode becomes a :class:`Rollout`: the full token sequence, a
mask of the tokens the agent generated (the only tokens any loss touches), the
reward, the environment feedback and the turn trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from transformers.cache_utils import Cache, DynamicLayer

from tasks.base import Episode, Task, TaskDomain, render_user_message

from .lengths import length_groups
from .settings import SamplingConfig
from .tokenizer import ChatEncoder


@dataclass
class Rollout:
    task: Task
    context: str | None  # context block the *student* saw (None for most methods)
    ids: list[int]
    agent_mask: list[int]  # 1 on tokens the agent generated
    agent_logprobs: list[float]  # sampling-time log-prob of each agent token, in order
    reward: float
    feedback: str
    episode: Episode = field(repr=False)
    truncated: bool = False

    @property
    def generated_tokens(self) -> int:
        return sum(self.agent_mask)

    @property
    def prompt_len(self) -> int:
        return self.agent_mask.index(1) if 1 in self.agent_mask else len(self.ids)


def _left_pad(seqs: Sequence[Sequence[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
        mask[i, width - len(s) :] = 1
    return ids.to(device), mask.to(device)


class _SlabLayer(DynamicLayer):
    """A cache layer whose keys/values live in a preallocated slab.

    ``DynamicLayer`` appends with ``torch.cat``, which copies the whole cache
    every decoded token, so a decode step costs as much as the cache is large
    (with the compaction below: tool use at batch 200, 13.4 -> 26.2 rollouts/s,
    ``benchmarks/bench_rollout.py``).  Here a token is written in place; the slab is reallocated only by :meth:`reserve`
    (once per turn) or when a write would overflow it.  ``keys``/``values`` are
    views of the filled part, so the model sees an ordinary cache.
    """

    # the slab (None before the first write: the methods below check ``is_initialized``) and its filled length
    _k: Any
    _v: Any
    _n: int
    keys: Any  # views of the slab's filled part (DynamicLayer's own attributes, None before the first write)
    values: Any

    def lazy_initialization(self, key_states, value_states) -> None:
        super().lazy_initialization(key_states, value_states)
        self._k = self._v = None
        self._n = 0

    def _resize(self, capacity: int, k_like: torch.Tensor, v_like: torch.Tensor) -> None:
        B, H, _, D = k_like.shape
        k = k_like.new_empty((B, H, capacity, D))
        v = v_like.new_empty((B, H, capacity, v_like.shape[-1]))
        if self._n:
            k[:, :, : self._n] = self._k[:, :, : self._n]
            v[:, :, : self._n] = self._v[:, :, : self._n]
        self._k, self._v = k, v

    def _views(self) -> None:
        self.keys, self.values = self._k[:, :, : self._n], self._v[:, :, : self._n]

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        need = self._n + key_states.shape[-2]
        if self._k is None or need > self._k.shape[-2]:
            self._resize(max(need, 2 * self._n), key_states, value_states)
        self._k[:, :, self._n : need] = key_states
        self._v[:, :, self._n : need] = value_states
        self._n = need
        self._views()
        return self.keys, self.values

    def reserve(self, extra: int) -> None:
        """Make room for ``extra`` more tokens without a reallocation."""
        if self.is_initialized and self._n + extra > self._k.shape[-2]:
            self._resize(self._n + extra, self._k, self._v)

    def gather(self, columns: torch.Tensor, extra: int) -> None:
        """Keep, per row, the cache columns ``columns`` [B, W] (in order), with room for ``extra`` more."""
        if not self.is_initialized:
            return
        B, H, _, D = self._k.shape
        W = columns.shape[1]
        idx = columns[:, None, :, None].expand(B, H, W, D)
        k = self._k.new_empty((B, H, W + extra, D))
        v = self._v.new_empty((B, H, W + extra, self._v.shape[-1]))
        torch.gather(self._k[:, :, : self._n], 2, idx, out=k[:, :, :W])
        torch.gather(self._v[:, :, : self._n], 2, idx.expand(B, H, W, self._v.shape[-1]), out=v[:, :, :W])
        self._k, self._v, self._n = k, v, W
        self._views()

    def write(self, rows: torch.Tensor, start: int, k: torch.Tensor, v: torch.Tensor, batch: int, room: int) -> None:
        """Write ``k``/``v`` [b, H, w, D] into rows ``rows`` at columns ``start``..``start + w``
        (columns :meth:`open` made), allocating a zeroed slab of ``batch`` rows and ``room``
        columns on first use.  Does not move the filled length (:meth:`open` does)."""
        if not self.is_initialized:
            self.lazy_initialization(k, v)
            self._n = 0
            self._k = k.new_zeros((batch, k.shape[1], room, k.shape[3]))
            self._v = v.new_zeros((batch, v.shape[1], room, v.shape[3]))
        self._k[rows, :, start : start + k.shape[2]] = k
        self._v[rows, :, start : start + v.shape[2]] = v

    def open(self, width: int) -> None:
        """Zero the next ``width`` columns (room for them is reserved)."""
        if self.is_initialized:
            self._k[:, :, self._n : self._n + width] = 0
            self._v[:, :, self._n : self._n + width] = 0

    def adopt(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Replace the cache by ``k``/``v`` [B, H, n, D], all filled."""
        self._k, self._v, self._n = k, v, k.shape[2]
        self._views()

    def advance(self, width: int) -> None:
        self._n += width
        self._views()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized and self._n:
            self._k, self._v = self._k[indices], self._v[indices]
            self._views()


class _SlabCache(Cache):
    def __init__(self):
        super().__init__(layer_class_to_replicate=_SlabLayer)

    @property
    def slabs(self) -> list[_SlabLayer]:
        """The layers, each a :class:`_SlabLayer` (``layer_class_to_replicate``)."""
        return cast(list[_SlabLayer], self.layers)

    def reserve(self, extra: int) -> None:
        for layer in self.slabs:
            layer.reserve(extra)

    def gather(self, columns: torch.Tensor, extra: int) -> None:
        for layer in self.slabs:
            layer.gather(columns, extra)


@dataclass
class _RowsAside:
    """Rows of a decoding batch set aside (parked) with their cache: batch row numbers, per-layer
    keys and values, attention mask and lengths, each left-padded to its own width."""

    rows: torch.Tensor
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    attn: torch.Tensor
    length: torch.Tensor


class _Batch:
    """KV-cached state of a batch of conversations that grow turn by turn.

    Every row shares one column layout: a row's real tokens sit where its
    attention mask is 1, padding (left padding of the first prompt, padding
    inside later segments, tokens fed after a row finished) where it is 0.
    Position ids count real tokens only, so RoPE sees each conversation exactly
    as a full forward of its unpadded ids would.  Appending a turn therefore
    costs a forward over the new tokens only, not a re-prefill of the whole
    conversation, and finished conversations leave the batch.

    Ragged turns leave padding columns (a row that stopped early keeps being
    fed masked pads until the longest row ends; segments are left-padded to the
    longest).  Before a new segment is appended, each row's real columns are
    gathered into a left-padded layout (:meth:`_compact`): keys carry their
    RoPE positions with them, so moving them between columns changes nothing
    but the attention's length.
    """

    def __init__(self, model, prompts: Sequence[Sequence[int]], pad_id: int):
        self.model, self.pad_id = model, pad_id
        self.device = next(model.parameters()).device
        self.cache = _SlabCache()
        self.headroom = 0  # tokens the next decode will add: reserved when the cache is rebuilt
        self.attn = torch.zeros((len(prompts), 0), dtype=torch.long, device=self.device)
        self.length = torch.zeros((len(prompts), 1), dtype=torch.long, device=self.device)  # real tokens per row
        self.logits: Any = None  # next-token logits of every row (set by extend below)
        self.extend(prompts)

    def _forward(self, ids: torch.Tensor, real: torch.Tensor) -> None:
        """Feed ``ids`` [B, S]; ``real`` [B, S] is 1 on real tokens, 0 on padding."""
        pos = self.length + real.cumsum(-1) - 1
        self.attn = torch.cat([self.attn, real], dim=1)
        out = self.model(
            input_ids=ids,
            attention_mask=self.attn,
            position_ids=pos.clamp(min=0),
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,  # only the next token's logits: no LM head over every prompt position
        )
        self.length = self.length + real.sum(-1, keepdim=True)
        self.logits = out.logits[:, -1, :]

    def extend(self, segments: Sequence[Sequence[int]]) -> None:
        """Append one (non-empty) segment of tokens per row, left-padded to a common width.

        Segments of very different lengths (code's test reports run from about 50
        to 300 tokens) are fed in length groups (:func:`~methods.core.lengths.length_groups`),
        each padded only to its own longest segment, into one cache layout: the
        same per-row computation as one padded forward, with less padding.
        """
        ids, real = _left_pad(segments, self.pad_id, self.device)
        self._compact(extra=ids.shape[1] + self.headroom)
        groups = length_groups([len(x) for x in segments]) if len(segments) > 1 else []
        if len(groups) <= 1:
            self._forward(ids, real)
        else:
            self._forward_groups(ids, real, groups)

    def _forward_groups(self, ids: torch.Tensor, real: torch.Tensor, groups: list[list[int]]) -> None:
        """:meth:`_forward` of a left-padded segment [B, W], one length group of rows at a time."""
        B, W = ids.shape
        past = self.attn.shape[1]
        pos = (self.length + real.cumsum(-1) - 1).clamp(min=0)
        attn = torch.cat([self.attn, real], dim=1)
        for layer in self.cache.slabs:
            layer.open(W)
        logits = None
        for rows in groups:
            w = int(real[rows].sum(-1).max())
            idx = torch.tensor(rows, dtype=torch.long, device=self.device)
            sub = _SlabCache()
            if past:
                for li, layer in enumerate(self.cache.slabs):
                    sub.update(layer.keys[idx], layer.values[idx], li)
                sub.reserve(w)
            cols = torch.cat([attn[idx, :past], attn[idx, past + W - w :]], dim=1)
            out = self.model(
                input_ids=ids[idx, W - w :],
                attention_mask=cols,
                position_ids=pos[idx, W - w :],
                past_key_values=sub,
                use_cache=True,
                logits_to_keep=1,
            )
            while len(self.cache.slabs) < len(sub.slabs):
                self.cache.slabs.append(_SlabLayer())
            for layer, new in zip(self.cache.slabs, sub.slabs):
                layer.write(idx, past + W - w, new.keys[:, :, past:], new.values[:, :, past:], B, W + self.headroom)
            if logits is None:
                logits = out.logits.new_empty((B, out.logits.shape[-1]))
            logits[idx] = out.logits[:, -1, :]
        for layer in self.cache.slabs:
            layer.advance(W)
        self.attn = attn
        self.length = self.length + real.sum(-1, keepdim=True)
        self.logits = logits

    def _compact(self, extra: int, min_waste: float = 0.1) -> None:
        """Left-align each row's real columns when padding is over ``min_waste`` of the cache."""
        cols = self.attn.shape[1]
        n_real = self.attn.sum(-1)
        width = int(n_real.max()) if cols else 0
        if cols == 0 or cols - width <= min_waste * cols:
            self.cache.reserve(extra)
            return
        # stable sort puts padding (0) first and real columns (1) after, each in order
        order = torch.sort(self.attn, dim=1, stable=True).indices[:, cols - width :]
        self.cache.gather(order, extra)
        self.attn = torch.gather(self.attn, 1, order)

    def feed(self, tok: torch.Tensor, real: torch.Tensor) -> None:
        """Append one token per row; rows with ``real`` False get a masked pad."""
        self._forward(torch.where(real, tok, torch.full_like(tok, self.pad_id))[:, None], real.long()[:, None])

    def select(self, rows: Sequence[int]) -> None:
        """Keep only ``rows`` (in that order)."""
        idx = torch.tensor(list(rows), dtype=torch.long, device=self.device)
        self.cache.batch_select_indices(idx)
        self.attn, self.length, self.logits = self.attn[idx], self.length[idx], self.logits[idx]

    #: decoding sets finished rows aside (:meth:`_park`) once fewer than this share of the
    #: decoded rows is still running, and only when at least ``PARK_MIN_ROWS`` rows are decoded
    PARK_BELOW = 0.5
    PARK_MIN_ROWS = 16

    def decode(self, eos_id: int, max_new_tokens: int, temperature: float, generator, return_logprobs: bool):
        """Sample one continuation per row, each ending at ``eos_id`` or cut at ``max_new_tokens``.

        Returns (tokens, logprobs or None, unfed): every sampled token is in the
        cache except each row's ``unfed`` tail (the tokens of the last step),
        which the next :meth:`extend` must prepend to that row's segment.

        Rows that finished stop costing forwards: once most decoded rows are done,
        they are set aside with their cache (:meth:`_park`) and merged back after
        the last step (:meth:`_unpark`).  Every step still samples all rows from
        one [B, V] matrix (a parked row's logits stay as they were and its draws
        are discarded), so the generator's stream, and every running row's
        sample, are the same as without parking.
        """
        B = self.logits.shape[0]
        self.headroom = max_new_tokens
        self.cache.reserve(max_new_tokens)
        done = torch.zeros(B, dtype=torch.bool, device=self.device)
        logits = self.logits
        running: torch.Tensor | None = None  # rows still in the cache (None: all); the rest are parked
        parked: list[_RowsAside] = []
        steps, step_logp, live = [], [], []
        for t in range(max_new_tokens):
            if temperature == 0:
                tok = logits.argmax(-1)
            else:
                probs = torch.softmax(logits.float() / temperature, dim=-1)
                tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
            if return_logprobs:
                scaled = logits.float() / (temperature if temperature > 0 else 1.0)
                step_logp.append(torch.log_softmax(scaled, dim=-1).gather(-1, tok[:, None]).squeeze(-1))
            alive = ~done
            tok = torch.where(alive, tok, torch.full_like(tok, self.pad_id))
            steps.append(tok)
            live.append(alive)
            done |= tok == eos_id
            if bool(done.all()) or t + 1 == max_new_tokens:
                break
            if running is None:
                self.feed(tok, alive)
                logits = self.logits
            else:
                self.feed(tok[running], alive[running])
                logits[running] = self.logits
            running, logits = self._park(done, running, parked, logits)
        if parked:  # rows were parked, so some still ran: ``running`` is set
            self._unpark(parked, cast(torch.Tensor, running), logits)
        gen = torch.stack(steps, dim=1).tolist()
        lps = torch.stack(step_logp, dim=1).tolist() if return_logprobs else None
        last_alive = live[-1].tolist()
        tokens, logprobs, unfed = [], [], []
        for i, row in enumerate(gen):
            # rows are pad-filled only after their eos, so the kept prefix is contiguous
            n = row.index(eos_id) + 1 if eos_id in row else len(row)
            tokens.append(row[:n])
            unfed.append([row[-1]] if last_alive[i] else [])
            if lps is not None:
                logprobs.append(lps[i][:n])
        return tokens, (logprobs if return_logprobs else None), unfed

    def _park(self, done: torch.Tensor, running: torch.Tensor | None, parked: list[_RowsAside], logits: torch.Tensor):
        """Set the finished rows of the decoded ones aside when fewer than ``PARK_BELOW`` still run.

        Returns the rows still decoded and the [B, V] logits buffer (a copy once
        anything is parked, so that parked rows keep their last logits)."""
        rows = running if running is not None else torch.arange(len(done), device=self.device)
        still = ~done[rows]
        n_live = int(still.sum())
        if len(rows) < self.PARK_MIN_ROWS or n_live >= self.PARK_BELOW * len(rows):
            return running, logits
        off, on = (~still).nonzero().squeeze(-1), still.nonzero().squeeze(-1)
        parked.append(
            _RowsAside(
                rows[off],
                [layer.keys[off] for layer in self.cache.slabs],
                [layer.values[off] for layer in self.cache.slabs],
                self.attn[off],
                self.length[off],
            )
        )
        self.cache.batch_select_indices(on)
        self.attn, self.length, self.logits = self.attn[on], self.length[on], self.logits[on]
        return rows[on], (logits.clone() if running is None else logits)

    def _unpark(self, parked: list[_RowsAside], running: torch.Tensor, logits: torch.Tensor) -> None:
        """Merge parked rows and running rows back into one left-padded cache layout, rows in order."""
        layers = self.cache.slabs
        chunks = [
            *parked,
            _RowsAside(running, [la.keys for la in layers], [la.values for la in layers], self.attn, self.length),
        ]
        B, width = logits.shape[0], max(c.attn.shape[1] for c in chunks)
        attn = self.attn.new_zeros((B, width))
        length = self.length.new_zeros((B, 1))
        for c in chunks:
            attn[c.rows, width - c.attn.shape[1] :] = c.attn
            length[c.rows] = c.length
        for li, layer in enumerate(layers):
            k = layer.keys.new_zeros((B, layer.keys.shape[1], width, layer.keys.shape[3]))
            v = layer.values.new_zeros((B, layer.values.shape[1], width, layer.values.shape[3]))
            for c in chunks:
                k[c.rows, :, width - c.keys[li].shape[2] :] = c.keys[li]
                v[c.rows, :, width - c.values[li].shape[2] :] = c.values[li]
            layer.adopt(k, v)
        self.attn, self.length, self.logits = attn, length, logits


@torch.no_grad()
def sample(
    model,
    prompts: Sequence[Sequence[int]],
    eos_id: int,
    pad_id: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    return_logprobs: bool = False,
):
    """Sample one continuation per prompt; each ends with ``eos_id`` unless cut at ``max_new_tokens``.

    With ``return_logprobs`` also returns, per continuation, the log-probability
    of each sampled token under the sampling distribution softmax(logits / T):
    PPO's "old" log-probs, which then need no second forward pass.  As in verl,
    the policy being optimised is the tempered one (see ``token_logprobs``).

    Shapes: prompts are ragged lists; internally [B, T] left-padded with an
    attention mask and explicit position ids so that padding never shifts RoPE.
    """
    tokens, logprobs, _ = _Batch(model, prompts, pad_id).decode(
        eos_id, max_new_tokens, temperature, generator, return_logprobs
    )
    return (tokens, logprobs) if return_logprobs else tokens


def run_episodes(
    model,
    encoder: ChatEncoder,
    domain: TaskDomain,
    tasks: Sequence[Task],
    contexts: Sequence[str | None] | None,
    cfg: SamplingConfig,
    generator: torch.Generator | None = None,
    batch_size: int = 256,
) -> list[Rollout]:
    """Play one episode per task, all batched turn by turn.  Returns rollouts in task order."""
    contexts = list(contexts) if contexts is not None else [None] * len(tasks)
    out: list[Rollout] = []
    for start in range(0, len(tasks), batch_size):
        out += _run_chunk(
            model,
            encoder,
            domain,
            tasks[start : start + batch_size],
            contexts[start : start + batch_size],
            cfg,
            generator,
        )
    return out


def _initial_ids(encoder: ChatEncoder, domain: TaskDomain, task: Task, context: str | None) -> list[int]:
    messages = []
    if domain.system_message():
        messages.append(("system", domain.system_message()))
    messages.append(("user", render_user_message(task, context)))
    return encoder.prompt(messages)


@torch.no_grad()
def _run_chunk(model, encoder, domain, tasks, contexts, cfg, generator) -> list[Rollout]:
    episodes = [domain.reset(t) for t in tasks]
    ids = [_initial_ids(encoder, domain, t, c) for t, c in zip(tasks, contexts)]
    masks = [[0] * len(x) for x in ids]
    logps: list[list[float]] = [[] for _ in ids]
    truncated = [False] * len(tasks)
    active = [i for i, ep in enumerate(episodes) if not ep.done]
    batch = _Batch(model, [ids[i] for i in active], encoder.pad_id) if active else None
    while active:
        batch = cast(_Batch, batch)  # built above whenever a row is active
        room = [cfg.max_seq_len - len(ids[i]) for i in active]
        gens, gen_lp, unfed = batch.decode(
            encoder.eos_id, max(1, min(cfg.max_new_tokens, max(room))), cfg.temperature, generator, True
        )
        actions = []
        for i, g, lp, r in zip(active, gens, gen_lp, room):
            g = g[: max(r, 0)]
            logps[i] += lp[: len(g)]
            ids[i] += g
            masks[i] += [1] * len(g)
            actions.append(encoder.decode(g))
        results = domain.step_batch([episodes[i] for i in active], actions)
        keep, segments = [], []
        for row, (i, res) in enumerate(zip(active, results)):
            ep = episodes[i]
            over = len(ids[i]) >= cfg.max_seq_len or len(ep.turns) >= tasks[i].max_turns
            if res.done or ep.done:
                continue
            if over:
                truncated[i] = True
                continue
            nxt = turn_break_ids(encoder, res.observation, close=ids[i][-1] != encoder.eos_id)
            if len(ids[i]) + len(nxt) >= cfg.max_seq_len:
                truncated[i] = True
                continue
            ids[i] += nxt
            masks[i] += [0] * len(nxt)
            keep.append(row)
            segments.append(unfed[row] + nxt)
        active = [active[row] for row in keep]
        if active:
            if len(keep) < len(results):
                batch.select(keep)
            batch.extend(segments)
    return [
        Rollout(
            task=t,
            context=c,
            ids=ids[i],
            agent_mask=masks[i],
            agent_logprobs=logps[i],
            reward=float(ep.reward()),
            feedback=ep.feedback(),
            episode=ep,
            truncated=truncated[i],
        )
        for i, (t, c, ep) in enumerate(zip(tasks, contexts, episodes))
    ]


def turn_break_ids(encoder: ChatEncoder, observation: str | None, close: bool = False) -> list[int]:
    """Ids between an assistant turn and the next (none of them agent tokens): ``<|im_end|>`` when
    ``close`` (a turn cut at max_new_tokens is closed as the chat format requires), the end of the
    assistant message, the environment's observation as a ``tool`` message, the assistant header."""
    return (
        ([encoder.eos_id] if close else [])
        + encoder.after_assistant()
        + encoder.message("tool", observation or "")
        + encoder.header("assistant")
    )


def initial_prompt_ids(encoder: ChatEncoder, domain: TaskDomain, task: Task, context: str | None) -> list[int]:
    """Ids of the episode's opening messages plus the assistant header (what rollouts start from)."""
    return _initial_ids(encoder, domain, task, context)


def trajectory_ids(
    encoder: ChatEncoder, domain: TaskDomain, task: Task, context: str | None, turns, masked_turns=()
) -> tuple[list[int], list[int]]:
    """Canonical ids and agent mask of a finished trajectory (e.g. an expert demonstration),
    laid out exactly as :func:`run_episodes` lays out a sampled one.  The actions of
    ``masked_turns`` (turn indices) stay in the sequence but out of the mask."""
    ids = _initial_ids(encoder, domain, task, context)
    mask = [0] * len(ids)
    for k, turn in enumerate(turns):
        act = encoder.encode(turn.action) + [encoder.eos_id]
        ids += act
        mask += [0 if k in masked_turns else 1] * len(act)
        if k + 1 < len(turns):
            nxt = turn_break_ids(encoder, turn.observation)
            ids += nxt
            mask += [0] * len(nxt)
    return ids, mask
