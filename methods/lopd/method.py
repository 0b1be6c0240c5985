"""LOPD: latent on-policy self-distillation (Zhang et al., arXiv:2608.13040).

Follows the authors' code (``bingreeky/LOPD`` at 50c3d7f; element by element in
``docs/methods.md``, "LOPD's fidelity table"):

* the student samples B tasks x 1 rollout with GRPO's prompts (no context);
* for each task the top-J (``n_retrieve``) trajectories of the experience bank
  are retrieved, the task's own past success included (``allow_self_retrieval``,
  on in both reference configs; the bank is read only while training, so
  nothing reaches evaluation), and the composer (:mod:`.composer`) compresses
  each, read as "Task to solve: {x} ... Reference past trajectory: {task + trace}",
  into K latent vectors;
* a *frozen* copy of the warm-start policy, with those J·K latents in place of
  a placeholder span of its first user message, scores the student's tokens;
* the student minimises ``topk_tail(20)`` reverse KL to that teacher on its own
  samples (token-mean), on **every** rollout whose task retrieved something,
  reward 0 included (the reference marks a rollout ``failed``, i.e. unsupervised,
  only when its episode raised or retrieved nothing);
* the composer (LoRA + Q-Former, φ) takes one step on the mean over those
  rollouts of ``KL_i + β (m − A_i δ̄_i) + λ·mean(((c_φ − c_φ0)/s)²)`` (:mod:`.margin`,
  M1-M5; s the latents' scale, so that λ acts at the reference's unit scale), its
  gradient reaching φ through the frozen teacher, and β takes one dual step on
  the token-weighted Δ, as the reference's does;
* the bank stays as seeded (the base policy's own successes): the reference's
  trainer never adds to it (``grow_bank`` adds the run's successes).

Where the baselines hand-craft the teacher's privileged context (a reference
solution, a sibling, a demonstration, a skill), LOPD learns it.  φ starts from
the cold start (:mod:`.coldstart`, its own pipeline rule), whose latents
``c_φ0`` anchor it.

Ablations are config variants of this one module (``config/config.yaml``,
``ablations:``): ``train_composer: false`` (frozen composer, φ0 kept),
``margin`` 0 / 0.05 / 0.10, ``n_latents`` 8 / 16 / 32, ``n_retrieve`` 1 / 3;
the earlier readings of the recipe, ``distill_only_successes: true`` (only
rollouts with reward >= ``success_threshold`` distilled) and
``allow_self_retrieval: false`` (the paper's text); and the text control,
``teacher_context: text``: the same loop, rows, retrieved items and frozen
teacher, with the items handed to the teacher as text (retrieval's format)
instead of latents, so no composer and no margin step.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from methods.core.batch import RolloutBatch, agent_logits, pad_examples
from methods.core.distill import DivergenceConfig, checked_gain, distill_loss, distill_rows
from methods.core.lazy import lazy_import, no_grad
from methods.core.registry import Method, register_method
from methods.core.settings import BankConfig
from methods.core.teacher import Teacher
from methods.divergences import divergence

from .margin import (
    anchor_penalty,
    composer_objective,
    dual_update,
    privileged_margin,
    rollout_means,
    token_delta,
    token_weighted_margin,
)

if TYPE_CHECKING:
    from .composer import LatentComposer

# Loaded on first use: config resolution reads this module (methods/core/lazy.py).  The composer (an
# nn.Module), the bank (faiss) and the rollout helpers (transformers) are imported where they are used.
torch = lazy_import("torch")

FILL_MODES = ("shorter", "repeat")
TEACHER_CONTEXTS = ("latent", "text")


@dataclass
class LOPDConfig(DivergenceConfig):
    group_size: int = 1  # B tasks x 1 rollout
    divergence: str = "topk_tail"
    topk: int = 20
    # what the frozen teacher reads: "latent" (LOPD) | "text" (the control: the same items as text)
    teacher_context: str = "latent"
    # retrieval and the composer
    n_retrieve: int = 3  # J
    n_latents: int = 32  # K per retrieved item
    # fewer than J retrieved: "shorter" (fewer latents) | "repeat" (cycle the retrieved items to J)
    fill_missing: str = "shorter"
    allow_self_retrieval: bool = True  # the reference's configs (cold start and RL); the paper's text: off
    grow_bank: bool = False  # add the run's successes after each step (the reference's bank is static during RL)
    qformer_layers: int = 8  # depth of the shared-weight cross-attention stack (the reference's)
    qformer_heads: int = 4
    lora_r: int = 8
    lora_alpha: int = 16
    max_item_tokens: int = 512  # tokens the composer reads per item (the reference reads every token)
    # the privileged margin (M3-M5)
    margin: float = 0.05  # m
    anchor_weight: float = 0.2  # λ, on latents divided by their scale (the reference's are unit-scale)
    dual_lr: float = 0.5  # η_β
    beta_init: float = 0.0  # β₀
    composer_lr: float = 1e-5  # lr_φ (the paper's; profiles scale it and record the value)
    composer_weight_decay: float = 0.01  # torch's AdamW default, which the reference keeps (cold start and RL)
    train_composer: bool = True  # False: the "frozen composer" ablation (φ0 kept, no margin)
    # an episode at or above it counts as a success in the logged diagnostics (and for the filter below)
    success_threshold: float = 1.0
    # True: only successes are distilled (an earlier misreading, kept as the lopd_successes_only ablation)
    distill_only_successes: bool = False
    # cold start (its own rule): LoRA + Q-Former by NLL of the warm start's own successes
    cold_start_steps: int = 300
    cold_start_lr: float = 1e-3
    cold_start_batch: int = 16
    cold_start_holdout: float = 0.2  # share of the successes kept out to measure the latents' gain

    #: what the cold start (LoRA + Q-Former) depends on besides domain and seed: its key is a digest of them
    cold_start_fields: ClassVar[tuple[str, ...]] = (
        "n_latents",
        "n_retrieve",
        "fill_missing",
        "qformer_layers",
        "qformer_heads",
        "lora_r",
        "lora_alpha",
        "max_item_tokens",
        "allow_self_retrieval",
        "composer_weight_decay",
        "cold_start_steps",
        "cold_start_lr",
        "cold_start_batch",
        "cold_start_holdout",
    )

    def __post_init__(self):
        super().__post_init__()
        positive = (
            "n_retrieve",
            "n_latents",
            "qformer_layers",
            "qformer_heads",
            "lora_r",
            "lora_alpha",
            "max_item_tokens",
            "cold_start_batch",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.teacher_context not in TEACHER_CONTEXTS:
            raise ValueError(f"teacher_context must be one of {list(TEACHER_CONTEXTS)}, got {self.teacher_context!r}")
        if self.fill_missing not in FILL_MODES:
            raise ValueError(f"fill_missing must be one of {list(FILL_MODES)}, got {self.fill_missing!r}")
        if self.margin < 0 or self.anchor_weight < 0 or self.dual_lr < 0 or self.beta_init < 0:
            raise ValueError("margin, anchor_weight, dual_lr and beta_init must be >= 0")
        if not (0 < self.composer_lr < 1) or not (0 < self.cold_start_lr < 1):
            raise ValueError("composer_lr and cold_start_lr must be in (0, 1)")
        if not (0 <= self.composer_weight_decay < 1):
            raise ValueError(f"composer_weight_decay must be in [0, 1), got {self.composer_weight_decay}")
        if self.cold_start_steps < 0 or not (0 <= self.cold_start_holdout < 1):
            raise ValueError("cold_start_steps must be >= 0 and cold_start_holdout in [0, 1)")
        if not (0 < self.success_threshold <= 1):
            raise ValueError(f"success_threshold must be in (0, 1], got {self.success_threshold}")

    @property
    def latent(self) -> bool:
        """The teacher reads composed latents (LOPD); False: the text control."""
        return self.teacher_context == "latent"

    def cold_start_key(self) -> str | None:
        """What a cold start depends on besides domain and seed: K, J and a digest of every field in
        :attr:`cold_start_fields`, so that variants differing in any of them get their own cold
        start.  None for the text control, which has no composer to cold-start."""
        if not self.latent:
            return None
        fields = {f: getattr(self, f) for f in self.cold_start_fields}
        digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:8]
        return f"K{self.n_latents}_J{self.n_retrieve}_{digest}"


def build_composer(cfg: LOPDConfig, backbone, encoder, seed: int) -> LatentComposer:
    """The composer with φ initialised from ``seed`` without touching the run's RNG streams."""
    from .composer import LatentComposer

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LatentComposer(
            backbone,
            encoder,
            cfg.n_latents,
            cfg.qformer_layers,
            cfg.qformer_heads,
            cfg.lora_r,
            cfg.lora_alpha,
            cfg.max_item_tokens,
        )


def fill(hits: list, n: int, mode: str) -> list:
    """Retrieved items for one task, handled as configured when fewer than ``n`` came back."""
    if not hits or len(hits) >= n or mode == "shorter":
        return hits[:n]
    return [hits[i % len(hits)] for i in range(n)]


TEACHER_CHUNK = 8  # rollouts per latent-conditioned teacher forward
ANCHOR_CACHE_ITEMS = 4096  # cached anchor latents c_φ0, K·d floats each


#: the per-step names LOPD logs whatever happened (null where a step had nothing to compute them on)
STEP_KEYS = (
    "lopd_margin",  # Δ as the dual step reads it (token-weighted; the reference's logged "delta")
    "lopd_margin_mean",  # Δ as the composer's gradient reads it (the mean over rollouts, M3)
    "lopd_kl",
    "lopd_anchor",
    "lopd_success_delta",  # the teacher's per-token advantage over the student, on successful rollouts
    "lopd_failed_delta",  # ... and on failed ones (reward < success_threshold)
)


@register_method("lopd")
class LOPD(Method):
    Config = LOPDConfig
    #: the composer's token passes (compute-matched view): forward, and backward in the composer step
    pass_counters = ("composer_fwd_tokens", "composer_bwd_tokens")
    uses_bank = True
    needs_cold_start = True  # the latent teacher's composer (the text control's cold_start_key is None: none)

    @classmethod
    def cold_start(cls, cfg: LOPDConfig, *, backbone, encoder, bank, domain, seed: int, device) -> tuple[dict, dict]:
        """The composer (LoRA + Q-Former) trained on the base policy's own successes (the seeded
        bank) before RL (:func:`methods.lopd.coldstart.cold_start`); the state is its φ."""
        from .coldstart import cold_start

        if not cfg.latent:
            raise ValueError("the text control (teacher_context: text) has no composer to cold-start")
        composer = build_composer(cfg, backbone, encoder, seed).to(device)
        report = cold_start(cfg, composer, bank, domain, seed, device=device)
        b, a = report["before"], report["after"]
        print(
            f"[coldstart] {report['train_examples']} training / {report['heldout_examples']} held-out successes; "
            f"latent gain {b['latent_gain']:+.4f} -> {a['latent_gain']:+.4f} nats/token "
            f"(text context {a['text_gain']:+.4f}, "
            f"own solution {a['solution_gain']:+.4f}, random latents {a['random_gain']:+.4f})",
            file=sys.stderr,
        )
        return {"phi": {k: v.detach().cpu() for k, v in composer.trainable_state().items()}}, report

    def __init__(self, cfg: LOPDConfig, run):
        super().__init__(cfg, run)
        self.teacher = Teacher(run, "frozen", 0.0)  # a frozen copy of the warm start, always
        self._gain_logged = False
        self.composer: LatentComposer | None = None
        self.phi0: dict = {}
        self.optimizer = None
        self.cold_started = False
        self._cold_gains: dict[str, float] = {}
        if cfg.latent:
            self.composer = build_composer(cfg, self.teacher.model, run.encoder, run.seed).to(run.device)
            self.phi0 = {k: v.detach().clone() for k, v in self.composer.trainable_state().items()}
            path = run.cold_start_path
            if path:
                state = torch.load(path, map_location="cpu", weights_only=False)
                self.composer.load_trainable_state(state["phi"])
                self.phi0 = {k: v.detach().clone().to(run.device) for k, v in state["phi"].items()}
                # the cold start's measured gains after it (nats/token), logged with the first step's check
                after = (state.get("report") or {}).get("after") or {}
                self._cold_gains = {f"coldstart_{k}": v for k, v in after.items() if k.endswith("_gain")}
            self.cold_started = bool(path)
            self.composer.requires_grad_(False)
            for p in self.composer.trainable_state().values():
                p.requires_grad_(cfg.train_composer)
            params = [p for p in self.composer.parameters() if p.requires_grad]
            if params:
                self.optimizer = torch.optim.AdamW(params, lr=cfg.composer_lr, weight_decay=cfg.composer_weight_decay)
        self.beta = float(cfg.beta_init)
        from methods.experience import ExperienceBank
        from methods.experience.encoder import TextEncoder

        self.bank = ExperienceBank(
            BankConfig(**(run.bank_config or {})), TextEncoder(), allow_self_retrieval=cfg.allow_self_retrieval
        )
        if run.bank_path:
            self.bank.load(run.bank_path)
            self.bank.frozen = False
        # c_φ0 per (task, retrieved item), least recently used evicted first: tasks rarely
        # repeat within a run, and unbounded the cache grows by J·K·d floats per rollout
        self._anchor: OrderedDict[tuple[str, str], torch.Tensor] = OrderedDict()
        self._pending: dict | None = None
        self._composer_tokens = 0  # tokens the last compose() encoded (its backward pass goes through them again)

    # --- latents -----------------------------------------------------------------
    def retrieve(self, tasks):
        return [
            fill(h, self.cfg.n_retrieve, self.cfg.fill_missing)
            for h in self.bank.retrieve_each(tasks, self.cfg.n_retrieve)
        ]

    def compose(self, tasks, hits) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """Per task: latents [len(hits)·K, d] (grad to φ when it trains), plus all latents and their anchors
        [items, K, d]."""
        keys = [(t.task_id, e.task_id) for t, hs in zip(tasks, hits) for e in hs]
        with torch.set_grad_enabled(self.cfg.train_composer):
            per_task, lat, ids = self.composer.compose([t.prompt for t in tasks], hits)
        self._composer_tokens = sum(len(x) for x in ids)
        self.run.ledger.add_passes(composer_fwd_tokens=self._composer_tokens)
        if not self.cfg.train_composer:  # φ stays φ0: the latents are their own anchor
            return per_task, lat, lat.detach()
        missing = [i for i, k in enumerate(keys) if k not in self._anchor]
        if missing:
            self.run.ledger.add_passes(composer_fwd_tokens=sum(len(ids[i]) for i in missing))
            with torch.no_grad():
                anch = torch.func.functional_call(self.composer, self.phi0, ([ids[i] for i in missing],), strict=False)
            for i, a in zip(missing, anch):
                self._anchor[keys[i]] = a
        anchor = torch.stack([self._anchor[k] for k in keys]) if keys else lat.detach()
        for k in keys:
            self._anchor.move_to_end(k)
        while len(self._anchor) > ANCHOR_CACHE_ITEMS:
            self._anchor.popitem(last=False)
        return per_task, lat, anchor

    def teacher_forward(self, rollouts, latents) -> list[torch.Tensor | None]:
        """The latent-conditioned frozen teacher's logits [n_i, V] at each rollout's agent tokens (None: too long).

        The shared teacher batching (:meth:`Teacher.score_sequences`), in chunks of
        ``TEACHER_CHUNK`` rollouts (small chunks keep the activations in cache: measured
        faster on CPU than one batch, ``benchmarks/bench_lopd_step.py``), with
        :meth:`LatentComposer.teacher_logits` as the forward (gradients reach the latents)."""
        seqs = [
            self.composer.teacher_sequence(
                self.run.domain, r.task, int(lat.shape[0]), r.ids[r.prompt_len :], r.agent_mask[r.prompt_len :]
            )
            for r, lat in zip(rollouts, latents)
        ]

        def forward(ids, attn, mask, rows):
            return self.composer.teacher_logits(ids, attn, mask, [latents[i] for i in rows], [seqs[i][2] for i in rows])

        return self.teacher.score_sequences(
            [q[:2] for q in seqs], forward, self.run.train_cfg.temperature, batch_size=TEACHER_CHUNK
        )

    # --- the step ----------------------------------------------------------------
    def prepare(self, batch: RolloutBatch) -> dict[str, float]:
        from methods.experience.bank import same_group_share

        cfg, rs = self.cfg, batch.rollouts
        t0 = time.perf_counter()
        hits = self.retrieve([r.task for r in rs])
        t_ret = time.perf_counter() - t0
        rows = [i for i, h in enumerate(hits) if h]
        out = {
            "retrieved_per_task": sum(len(h) for h in hits) / max(len(hits), 1),
            "retrieved_same_group": same_group_share([r.task for r in rs], hits),
            # share of rollouts whose items include their own task's past success (self-retrieval)
            "retrieved_self": sum(any(e.task_id == r.task.task_id for e in h) for r, h in zip(rs, hits))
            / max(len(rs), 1),
            "lopd_retrieval_s": round(t_ret, 4),  # inside the update timer (retrieval RL's retrieval_s is not)
            "bank_size": len(self.bank),
        }
        teacher: list[torch.Tensor | None] = [None] * len(rs)
        self._pending = None
        if rows:
            if cfg.latent:
                scored, pending, gains = self._latent_scores(batch, rows, hits)
            else:
                scored, pending, gains = self._text_scores(batch, rows, hits)
            out.update(gains)
            for i, s in zip(rows, scored):
                teacher[i] = s
            self._pending = pending
        success = batch.rewards >= cfg.success_threshold
        has = torch.tensor([t is not None for t in teacher], device=batch.rewards.device)
        signal = has & success if cfg.distill_only_successes else has
        batch.extras["teacher_logits"] = [t.detach() if t is not None else None for t in teacher]
        batch.extras["teacher_signal"] = signal
        out["signal_share"] = float(signal.float().mean())
        # fixed names every step: null where nothing was retrieved (no teacher, no margin)
        out.update(dict.fromkeys(STEP_KEYS))
        if self._pending is not None:
            out.update(self._margin_terms(batch))
        return out

    def _latent_scores(self, batch, rows, hits):
        """The latent teacher's logits on ``rows`` (grad to φ when it trains), the composer step's
        pending state, and (first step only) the logged sanity check."""
        rs = batch.rollouts
        t0 = time.perf_counter()
        lat, all_lat, anchor = self.compose([rs[i].task for i in rows], [hits[i] for i in rows])
        t_comp = time.perf_counter() - t0
        teacher_before = self.run.ledger.teacher_tokens
        t0 = time.perf_counter()
        with torch.set_grad_enabled(self.cfg.train_composer):
            scored = self.teacher_forward([rs[i] for i in rows], lat)
        gains = {"composer_s": round(t_comp, 4), "teacher_s": round(time.perf_counter() - t0, 4)}
        if not self._gain_logged:
            self._gain_logged = True
            gains.update(self.gain_record([rs[i] for i in rows], [x.detach() for x in lat]))
            gains.update(self._cold_gains)
        pending = {
            "rows": [i for i, s in zip(rows, scored) if s is not None],
            "scored": [s for s in scored if s is not None],
            "latents": all_lat,
            "anchor": anchor,
            "items": [len(hits[i]) for i in rows],
            # what the composer step's backward pass goes through: the teacher (to the latents), then the composer
            "backward": {
                "teacher_bwd_tokens": self.run.ledger.teacher_tokens - teacher_before,
                "composer_bwd_tokens": self._composer_tokens,
            },
        }
        return scored, pending, gains

    def _text_scores(self, batch, rows, hits):
        """The text control: the same frozen teacher with the same retrieved items as text
        (retrieval's format, :func:`methods.retrieval_rl.render_experience`), no gradients."""
        from methods.core.distill import gain_record
        from methods.retrieval_rl import render_experience

        rs = [batch.rollouts[i] for i in rows]
        contexts = [render_experience(hits[i]) for i in rows]
        t0 = time.perf_counter()
        scored = self.teacher.score(rs, contexts, self.run.train_cfg.temperature)
        gains = {"teacher_s": round(time.perf_counter() - t0, 4)}
        if not self._gain_logged:
            self._gain_logged = True
            gains.update(gain_record(self.teacher, rs, contexts))
            gains["teacher_context_gain"] = checked_gain(self.name, gains["teacher_context_gain"])
            # at the first step the student is the warm start, the frozen teacher's own weights
            gains["teacher_minus_student_expert"] = gains["teacher_context_gain"]
        pending = {
            "rows": [i for i, s in zip(rows, scored) if s is not None],
            "scored": [s for s in scored if s is not None],
            "hits": [hits[i] for i in rows],
        }
        return scored, pending, gains

    def gain_record(self, rollouts, latents) -> dict[str, float]:
        """The sanity check every self-distillation method logs once (:func:`methods.core.distill.gain_record`),
        with latents for the text context: the frozen teacher's mean per-token log-likelihood of the
        expert's actions with each task's composed latents minus without any context
        (``teacher_context_gain``), and the same on the student's own failed attempts
        (``teacher_failed_shift``: a size, not a pass/fail).  At the first step the student is the
        warm start, so the gain is also the teacher's lead over the student on expert actions
        (``teacher_minus_student_expert``, logged again at the last step).  Reuses this step's
        latents, so it draws no random numbers and changes nothing the run trains on."""
        firsts = {}
        for r, lat in zip(rollouts, latents):
            firsts.setdefault(r.task.task_id, (r.task, lat))
        expert = [self._expert_item(task, lat) for task, lat in firsts.values()]
        gain = checked_gain(self.name, self._latent_shift(expert))
        out = {"teacher_context_gain": gain, "teacher_context_pairs": len(expert), "teacher_minus_student_expert": gain}
        failed = [
            (r.task, lat, r.ids[r.prompt_len :], r.agent_mask[r.prompt_len :])
            for r, lat in zip(rollouts, latents)
            if r.reward < 1.0
        ]
        if failed:
            out.update({"teacher_failed_shift": self._latent_shift(failed), "teacher_failed_attempts": len(failed)})
        return out

    def _expert_item(self, task, lat):
        """(task, latents, the expert's tokens after the first prompt, their agent mask)."""
        from .composer import action_tail

        domain = self.run.domain
        return task, lat, *action_tail(self.run.encoder, domain, task, domain.expert_trajectory(task).turns)

    @no_grad
    def expert_gap(self, tasks, hits) -> float:
        """The teacher's lead over the current student on the expert's actions of ``tasks`` (mean
        per-token log-likelihood, teacher with this step's context minus the student without): a
        frozen teacher that ends behind its student pulls it back.  Draws no random numbers."""
        from methods.core.evaluate import mean_agent_logprob
        from methods.retrieval_rl import render_experience

        domain, enc, model = self.run.domain, self.run.encoder, self.run.model
        turns = [domain.expert_trajectory(t).turns for t in tasks]
        was_training = model.training
        student = mean_agent_logprob(model, enc, domain, [(t, None, tr) for t, tr in zip(tasks, turns)])
        model.train(was_training)
        if self.cfg.latent:
            per, _, _ = self.composer.compose([t.prompt for t in tasks], hits)
            teacher = self._latent_logprob([self._expert_item(t, lat) for t, lat in zip(tasks, per)], True)
        else:
            items = [(t, render_experience(h), tr) for t, h, tr in zip(tasks, hits, turns)]
            teacher = mean_agent_logprob(self.teacher.model, enc, domain, items)
        return teacher - student

    def _latent_shift(self, items) -> float:
        """Mean per-token log-lik of the agent tokens of ``items`` = [(task, latents, tail ids, tail
        mask)] under the frozen teacher with the latents minus with no context (LoRA off both ways)."""
        return self._latent_logprob(items, True) - self._latent_logprob(items, False)

    @no_grad
    def _latent_logprob(self, items, with_latents: bool) -> float:
        """Mean per-token log-lik of the agent tokens of ``items`` under the frozen teacher, with
        each item's latents in its context or with no context."""
        domain = self.run.domain
        seqs = [
            (self.composer.teacher_sequence(domain, t, int(lat.shape[0]) if with_latents else 0, ids, m), lat)
            for t, lat, ids, m in items
        ]
        seqs = [s for s in seqs if len(s[0][0]) <= self.teacher.max_len]
        tot, cnt = 0.0, 0
        for start in range(0, len(seqs), TEACHER_CHUNK):
            chunk = seqs[start : start + TEACHER_CHUNK]
            ids, attn, mask = pad_examples([c[0][:2] for c in chunk], self.run.encoder.pad_id)
            dev = self.run.device
            ids, attn, mask = ids.to(dev), attn.to(dev), mask.to(dev)
            lats = [c[1] if with_latents else c[1][:0] for c in chunk]
            logits = self.composer.teacher_logits(ids, attn, mask, lats, [c[0][2] for c in chunk])
            tok = ids[:, 1:][mask.bool()]
            lp = torch.log_softmax(logits.float(), -1).gather(-1, tok[:, None])
            tot += float(lp.sum())
            cnt += int(lp.numel())
        return tot / max(cnt, 1)

    def _margin_terms(self, batch: RolloutBatch) -> dict[str, float]:
        """Δ (M1-M3) and the teacher's per-token advantage on successes and failures on this batch;
        for the latent teacher also the composer's KL and the anchor, kept for the composer step."""
        p, cfg = self._pending, self.cfg
        rows = p["rows"]
        if not rows:
            self._pending = None
            return {}
        mask = batch.loss_mask[rows].bool()
        student_lp = batch.sample_logp[rows][mask]  # the sampling student's log-prob of each of its tokens
        teacher_logits = torch.cat(p["scored"])
        tok = batch.input_ids[rows][:, 1:][mask]
        teacher_lp = torch.log_softmax(teacher_logits, -1).gather(-1, tok[:, None]).squeeze(-1)
        delta = token_delta(teacher_lp, student_lp)
        counts = mask.sum(-1).tolist()
        rewards = batch.rewards[rows]
        margin = privileged_margin(delta, counts, rewards)
        per_rollout = torch.split(delta.detach(), counts)

        def mean_delta(pick) -> float | None:
            ks = [k for k, i in enumerate(rows) if pick(float(batch.rewards[i])) and counts[k]]
            return sum(float(per_rollout[k].mean()) for k in ks) / len(ks) if ks else None

        out = {
            "lopd_margin": float(token_weighted_margin(delta.detach(), counts, rewards)),
            "lopd_margin_mean": float(margin.detach()),
            "lopd_success_delta": mean_delta(lambda r: r >= cfg.success_threshold),
            "lopd_failed_delta": mean_delta(lambda r: r < cfg.success_threshold),
        }
        if not (cfg.latent and cfg.train_composer):  # the composer's terms only where it takes a step
            return out
        sig = [k for k, i in enumerate(rows) if bool(batch.extras["teacher_signal"][i])]
        if sig:
            with torch.no_grad():  # the student's distribution on its own tokens (pre-update, detached)
                srow = [rows[k] for k in sig]
                width = int(batch.attention_mask[srow].sum(-1).max())
                s_logits = agent_logits(
                    self.run.model,
                    batch.input_ids[srow][:, :width],
                    batch.attention_mask[srow][:, :width],
                    batch.loss_mask[srow][:, : width - 1],
                )
                s_logits = s_logits / self.run.train_cfg.temperature
            t_sig = torch.cat([p["scored"][k] for k in sig])
            # the same KL as the student's, its gradient taken on the teacher side (it reaches φ through
            # the latents); per rollout, then the mean over rollouts, as the reference averages its loss
            per_token = divergence(
                cfg.divergence, s_logits, t_sig, m=cfg.topk, support=cfg.topk_support, grad_to="teacher"
            )
            kl = rollout_means(per_token, [counts[k] for k in sig]).mean()
        else:
            kl = teacher_logits.new_zeros(())
        anchor = anchor_penalty(p["latents"], p["anchor"], self.composer.latent_rms, p["items"])
        p.update({"margin": margin, "margin_dual": out["lopd_margin"], "kl": kl, "anchor_pen": anchor})
        out.update({"lopd_kl": float(kl.detach()), "lopd_anchor": float(anchor.detach())})
        return out

    def after_step(self, batch: RolloutBatch) -> dict[str, float]:
        cfg, p = self.cfg, self._pending
        out = {"lopd_beta": self.beta if cfg.latent else None}  # the text control has no margin step
        if p is not None and "margin" in p and cfg.train_composer:
            t0 = time.perf_counter()
            loss = composer_objective(p["kl"], p["margin"], self.beta, cfg.margin, p["anchor_pen"], cfg.anchor_weight)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(
                [q for q in self.composer.parameters() if q.requires_grad], self.run.train_cfg.grad_clip
            )
            self.optimizer.step()
            self.run.ledger.add_passes(**p["backward"])
            self.beta = dual_update(self.beta, p["margin_dual"], cfg.margin, cfg.dual_lr)
            out.update(
                {
                    "lopd_composer_loss": float(loss.detach()),
                    "lopd_composer_grad_norm": float(gnorm),
                    "composer_step_s": round(time.perf_counter() - t0, 4),
                    "lopd_beta": self.beta,
                }
            )
        self._pending = None
        if self.run.ledger.remaining < cfg.group_size:  # the last step: where the teacher ends against the student
            hits = self.retrieve([r.task for r in batch.rollouts])
            pairs = {r.task.task_id: (r.task, h) for r, h in zip(batch.rollouts, hits) if h}
            if pairs:
                tasks, hs = zip(*pairs.values())
                out["teacher_minus_student_expert"] = self.expert_gap(list(tasks), list(hs))
        t0 = time.perf_counter()
        added = self.bank.add_rollouts(batch.rollouts, step=self.run.ledger.steps) if cfg.grow_bank else 0
        out.update({"bank_added": added, "bank_size": len(self.bank), "bank_add_s": round(time.perf_counter() - t0, 4)})
        return out

    # --- the student's update: distillation on the rollouts with a teacher signal -----
    def trainable_rows(self, batch: RolloutBatch) -> torch.Tensor:
        return distill_rows(batch)

    def loss(self, batch, rows, logp, logits):
        return distill_loss(self.cfg, batch, rows, logits)

    # --- checkpoints ---------------------------------------------------------------
    def state_dict(self):
        phi = self.composer.trainable_state() if self.composer is not None else {}
        return {
            "phi": {k: v.detach().clone() for k, v in phi.items()},
            "phi0": self.phi0,
            "optimizer": self.optimizer.state_dict() if self.optimizer else None,
            "beta": self.beta,
            "bank": self.bank.state_dict(),
            "gain_logged": self._gain_logged,
        }

    def load_state_dict(self, state) -> None:
        if self.composer is not None:
            self.composer.load_trainable_state(state["phi"])
        self.phi0 = state["phi0"]
        self._anchor.clear()
        if self.optimizer is not None and state["optimizer"] is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        self.beta = float(state["beta"])
        self.bank.load_state_dict(state["bank"])
        self._gain_logged = state["gain_logged"]
