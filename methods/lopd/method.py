"""LOPD: latent on-policy self-distillation (Zhang et al., arXiv:2608.13040).

How it differs from GRPO and from the self-distillation baselines
(``docs/methods.md``, LOPD):

* the student samples B tasks x 1 rollout with GRPO's prompts (no context);
* for each task, the top-J (``n_retrieve``) successful trajectories of *other*
  training tasks are retrieved from the experience bank (leak-free,
  :mod:`methods.experience`), and the composer (:mod:`.composer`) compresses
  each into K latent vectors;
* a *frozen* copy of the warm-start policy, with those J·K latents in place of
  a placeholder span of its first user message, scores the student's tokens;
* the student minimises ``topk_tail(20)`` reverse KL to that teacher on its own
  samples (token-mean), on successful episodes whose task retrieved something
  (``distill_only_successes``; as in the reference code);
* the composer (LoRA + Q-Former, φ) takes one step on
  ``L_distill + β (m − Δ) + λ·mean((c_φ − c_φ0)²)`` (:mod:`.margin`, M1-M5), its
  gradient reaching φ through the frozen teacher, and β takes one dual step;
* the bank grows with the run's own successes after each step.

Where the baselines hand-craft the teacher's privileged context (a reference
solution, a sibling, a demonstration, a skill), LOPD learns it.  φ starts from
the cold start (:mod:`.coldstart`, its own pipeline rule), whose latents
``c_φ0`` anchor it.

Ablations are config variants of this one module (``config/config.yaml``,
``ablations:``): ``train_composer: false`` (frozen composer, φ0 kept),
``margin`` 0 / 0.05 / 0.10, ``n_latents`` 8 / 16 / 32, ``n_retrieve`` 1 / 3.
"""

from __future__ import annotations

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
from methods.divergences import divergence, token_mean

from .margin import anchor_penalty, composer_objective, dual_update, privileged_margin, token_delta

if TYPE_CHECKING:
    from .composer import LatentComposer

# Loaded on first use: config resolution reads this module (methods/core/lazy.py).  The composer (an
# nn.Module), the bank (faiss) and the rollout helpers (transformers) are imported where they are used.
torch = lazy_import("torch")

FILL_MODES = ("shorter", "repeat")


@dataclass
class LOPDConfig(DivergenceConfig):
    group_size: int = 1  # B tasks x 1 rollout
    divergence: str = "topk_tail"
    topk: int = 20
    # retrieval and the composer
    n_retrieve: int = 3  # J
    n_latents: int = 32  # K per retrieved item
    # fewer than J retrieved: "shorter" (fewer latents) | "repeat" (cycle the retrieved items to J)
    fill_missing: str = "shorter"
    allow_self_retrieval: bool = False
    qformer_layers: int = 2  # depth of the shared-weight cross-attention stack
    qformer_heads: int = 4
    lora_r: int = 8
    lora_alpha: int = 16
    max_item_tokens: int = 512  # tokens of "Task to solve ... Reference past trajectory ..." per item
    # the privileged margin (M3-M5)
    margin: float = 0.05  # m
    anchor_weight: float = 0.2  # λ
    dual_lr: float = 0.5  # η_β
    beta_init: float = 0.0  # β₀
    composer_lr: float = 1e-5  # lr_φ (the paper's; profiles scale it and record the value)
    train_composer: bool = True  # False: the "frozen composer" ablation (φ0 kept, no margin)
    # an episode at or above it is a success (distillation signal; A = 2r - 1 uses r itself)
    success_threshold: float = 1.0
    distill_only_successes: bool = True  # failed episodes get no distillation signal (the reference code)
    # cold start (its own rule): LoRA + Q-Former by NLL of the warm start's own successes
    cold_start_steps: int = 300
    cold_start_lr: float = 1e-3
    cold_start_batch: int = 16
    cold_start_holdout: float = 0.2  # share of the successes kept out to measure the latents' gain

    #: what the cold start (LoRA + Q-Former) depends on: runs sharing its file must agree on them
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
        if self.fill_missing not in FILL_MODES:
            raise ValueError(f"fill_missing must be one of {list(FILL_MODES)}, got {self.fill_missing!r}")
        if self.margin < 0 or self.anchor_weight < 0 or self.dual_lr < 0 or self.beta_init < 0:
            raise ValueError("margin, anchor_weight, dual_lr and beta_init must be >= 0")
        if not (0 < self.composer_lr < 1) or not (0 < self.cold_start_lr < 1):
            raise ValueError("composer_lr and cold_start_lr must be in (0, 1)")
        if self.cold_start_steps < 0 or not (0 <= self.cold_start_holdout < 1):
            raise ValueError("cold_start_steps must be >= 0 and cold_start_holdout in [0, 1)")
        if not (0 < self.success_threshold <= 1):
            raise ValueError(f"success_threshold must be in (0, 1], got {self.success_threshold}")

    def cold_start_key(self) -> str:
        """What a cold start depends on besides domain and seed (variants that share it share the file)."""
        return f"K{self.n_latents}_J{self.n_retrieve}"


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


@register_method("lopd")
class LOPD(Method):
    Config = LOPDConfig
    uses_bank = True
    needs_cold_start = True

    @classmethod
    def cold_start(cls, cfg: LOPDConfig, *, backbone, encoder, bank, domain, seed: int, device) -> tuple[dict, dict]:
        """The composer (LoRA + Q-Former) trained on the base policy's own successes (the seeded
        bank) before RL (:func:`methods.lopd.coldstart.cold_start`); the state is its φ."""
        from .coldstart import cold_start

        composer = build_composer(cfg, backbone, encoder, seed).to(device)
        report = cold_start(cfg, composer, bank, domain, seed, device=device)
        b, a = report["before"], report["after"]
        print(
            f"[coldstart] {report['train_examples']} training / {report['heldout_examples']} held-out successes; "
            f"latent gain {b['latent_gain']:+.4f} -> {a['latent_gain']:+.4f} nats/token (text context {a['text_gain']:+.4f})",
            file=sys.stderr,
        )
        return {"phi": {k: v.detach().cpu() for k, v in composer.trainable_state().items()}}, report

    def __init__(self, cfg: LOPDConfig, run):
        super().__init__(cfg, run)
        self.teacher = Teacher(run, "frozen", 0.0)  # a frozen copy of the warm start, always
        self._gain_logged = False
        self.composer = build_composer(cfg, self.teacher.model, run.encoder, run.seed).to(run.device)
        self.phi0 = {k: v.detach().clone() for k, v in self.composer.trainable_state().items()}
        path = run.cold_start_path
        if path:
            state = torch.load(path, map_location="cpu", weights_only=False)
            self.composer.load_trainable_state(state["phi"])
            self.phi0 = {k: v.detach().clone().to(run.device) for k, v in state["phi"].items()}
        self.cold_started = bool(path)
        self.composer.requires_grad_(False)
        for p in self.composer.trainable_state().values():
            p.requires_grad_(cfg.train_composer)
        params = [p for p in self.composer.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=cfg.composer_lr, weight_decay=0.0) if params else None
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
        """Per task: latents [len(hits)·K, d] (grad to φ when it trains), plus all latents and their anchors [items, K, d]."""
        keys = [(t.task_id, e.task_id) for t, hs in zip(tasks, hits) for e in hs]
        with torch.set_grad_enabled(self.cfg.train_composer):
            per_task, lat, ids = self.composer.compose([t.prompt for t in tasks], hits)
        self._composer_tokens = sum(len(x) for x in ids)
        self.run.ledger.add_passes(composer_fwd_tokens=self._composer_tokens)
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
            "lopd_retrieval_s": round(t_ret, 4),  # inside the update timer (retrieval RL's retrieval_s is not)
            "bank_size": len(self.bank),
        }
        teacher: list[torch.Tensor | None] = [None] * len(rs)
        self._pending = None
        if rows:
            t0 = time.perf_counter()
            lat, all_lat, anchor = self.compose([rs[i].task for i in rows], [hits[i] for i in rows])
            t_comp = time.perf_counter() - t0
            t0 = time.perf_counter()
            teacher_before = self.run.ledger.teacher_tokens
            with torch.set_grad_enabled(cfg.train_composer):
                scored = self.teacher_forward([rs[i] for i in rows], lat)
            out.update({"composer_s": round(t_comp, 4), "teacher_s": round(time.perf_counter() - t0, 4)})
            for i, s in zip(rows, scored):
                teacher[i] = s
            if not self._gain_logged:
                self._gain_logged = True
                out.update(self.gain_record([rs[i] for i in rows], [x.detach() for x in lat]))
            # what the composer step's backward pass goes through: the teacher (to the latents), then the composer
            backward = {
                "teacher_bwd_tokens": self.run.ledger.teacher_tokens - teacher_before,
                "composer_bwd_tokens": self._composer_tokens,
            }
            self._pending = {
                "rows": [i for i, s in zip(rows, scored) if s is not None],
                "scored": [s for s in scored if s is not None],
                "latents": all_lat,
                "anchor": anchor,
                "backward": backward,
            }
        success = batch.rewards >= cfg.success_threshold
        has = torch.tensor([t is not None for t in teacher], device=batch.rewards.device)
        signal = has & success if cfg.distill_only_successes else has
        batch.extras["teacher_logits"] = [t.detach() if t is not None else None for t in teacher]
        batch.extras["teacher_signal"] = signal
        out["signal_share"] = float(signal.float().mean())
        # fixed names every step: null where nothing was retrieved (no teacher, no margin)
        out.update(dict.fromkeys(("lopd_margin", "lopd_kl", "lopd_anchor", "lopd_success_delta")))
        if self._pending is not None:
            out.update(self._margin_terms(batch))
        return out

    def gain_record(self, rollouts, latents) -> dict[str, float]:
        """The sanity check every self-distillation method logs once (:func:`methods.core.distill.gain_record`),
        with latents for the text context: the frozen teacher's mean per-token log-likelihood of the
        expert's actions with each task's composed latents minus without any context
        (``teacher_context_gain``), and the same on the student's own failed attempts
        (``teacher_failed_shift``: a size, not a pass/fail).  Reuses this step's latents, so it
        draws no random numbers and changes nothing the run trains on."""
        from methods.core.rollout import initial_prompt_ids, trajectory_ids

        domain, enc = self.run.domain, self.run.encoder
        firsts = {}
        for r, lat in zip(rollouts, latents):
            firsts.setdefault(r.task.task_id, (r.task, lat))
        expert = []
        for task, lat in firsts.values():
            ids, mask = trajectory_ids(enc, domain, task, None, domain.expert_trajectory(task).turns)
            start = len(initial_prompt_ids(enc, domain, task, None))
            expert.append((task, lat, ids[start:], mask[start:]))
        out = {
            "teacher_context_gain": checked_gain(self.name, self._latent_shift(expert)),
            "teacher_context_pairs": len(expert),
        }
        failed = [
            (r.task, lat, r.ids[r.prompt_len :], r.agent_mask[r.prompt_len :])
            for r, lat in zip(rollouts, latents)
            if r.reward < 1.0
        ]
        if failed:
            out.update({"teacher_failed_shift": self._latent_shift(failed), "teacher_failed_attempts": len(failed)})
        return out

    @no_grad
    def _latent_shift(self, items) -> float:
        """Mean per-token log-lik of the agent tokens of ``items`` = [(task, latents, tail ids, tail
        mask)] under the frozen teacher with the latents minus with no context (LoRA off both ways)."""
        domain = self.run.domain
        seqs = [
            (
                self.composer.teacher_sequence(domain, t, int(lat.shape[0]), ids, m),
                self.composer.teacher_sequence(domain, t, 0, ids, m),
                lat,
            )
            for t, lat, ids, m in items
        ]
        seqs = [s for s in seqs if len(s[0][0]) <= self.teacher.max_len]
        if not seqs:
            return 0.0

        def mean_logp(which: int) -> float:
            tot, cnt = 0.0, 0
            for start in range(0, len(seqs), TEACHER_CHUNK):
                chunk = seqs[start : start + TEACHER_CHUNK]
                ids, attn, mask = pad_examples([c[which][:2] for c in chunk], self.run.encoder.pad_id)
                dev = self.run.device
                ids, attn, mask = ids.to(dev), attn.to(dev), mask.to(dev)
                lats = [c[2] if which == 0 else c[2][:0] for c in chunk]
                logits = self.composer.teacher_logits(ids, attn, mask, lats, [c[which][2] for c in chunk])
                tok = ids[:, 1:][mask.bool()]
                lp = torch.log_softmax(logits.float(), -1).gather(-1, tok[:, None])
                tot += float(lp.sum())
                cnt += int(lp.numel())
            return tot / max(cnt, 1)

        return mean_logp(0) - mean_logp(1)

    def _margin_terms(self, batch: RolloutBatch) -> dict[str, float]:
        """Δ (M1-M3), the composer's KL and the anchor on this batch, kept for the composer step."""
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
        margin = privileged_margin(delta, counts, batch.rewards[rows])
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
            # the same KL as the student's, its gradient taken on the teacher side (it reaches φ through the latents)
            kl = token_mean(
                divergence(cfg.divergence, s_logits, t_sig, m=cfg.topk, support=cfg.topk_support, grad_to="teacher")
            )
        else:
            kl = teacher_logits.new_zeros(())
        anchor = anchor_penalty(p["latents"], p["anchor"])
        succ = [k for k, i in enumerate(rows) if float(batch.rewards[i]) >= cfg.success_threshold]
        split = torch.split(delta.detach(), counts)
        gain = sum(float(split[k].mean()) for k in succ if counts[k]) / max(len([k for k in succ if counts[k]]), 1)
        p.update({"margin": margin, "kl": kl, "anchor_pen": anchor})
        return {
            "lopd_margin": float(margin.detach()),
            "lopd_kl": float(kl.detach()),
            "lopd_anchor": float(anchor.detach()),
            "lopd_success_delta": gain,
        }

    def after_step(self, batch: RolloutBatch) -> dict[str, float]:
        cfg, p = self.cfg, self._pending
        out = {"lopd_beta": self.beta}
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
            self.beta = dual_update(self.beta, float(p["margin"].detach()), cfg.margin, cfg.dual_lr)
            out.update(
                {
                    "lopd_composer_loss": float(loss.detach()),
                    "lopd_composer_grad_norm": float(gnorm),
                    "composer_step_s": round(time.perf_counter() - t0, 4),
                    "lopd_beta": self.beta,
                }
            )
        self._pending = None
        t0 = time.perf_counter()
        out.update(
            {
                "bank_added": self.bank.add_rollouts(batch.rollouts, step=self.run.ledger.steps),
                "bank_size": len(self.bank),
                "bank_add_s": round(time.perf_counter() - t0, 4),
            }
        )
        return out

    # --- the student's update: distillation on the rollouts with a teacher signal -----
    def trainable_rows(self, batch: RolloutBatch) -> torch.Tensor:
        return distill_rows(batch)

    def loss(self, batch, rows, logp, logits):
        return distill_loss(self.cfg, batch, rows, logits)

    # --- checkpoints ---------------------------------------------------------------
    def state_dict(self):
        return {
            "phi": {k: v.detach().clone() for k, v in self.composer.trainable_state().items()},
            "phi0": self.phi0,
            "optimizer": self.optimizer.state_dict() if self.optimizer else None,
            "beta": self.beta,
            "bank": self.bank.state_dict(),
            "gain_logged": self._gain_logged,
        }

    def load_state_dict(self, state) -> None:
        self.composer.load_trainable_state(state["phi"])
        self.phi0 = state["phi0"]
        self._anchor.clear()
        if self.optimizer is not None and state["optimizer"] is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        self.beta = float(state["beta"])
        self.bank.load_state_dict(state["bank"])
        self._gain_logged = state["gain_logged"]
