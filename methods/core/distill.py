"""What every on-policy self-distillation method shares.

The student samples its own trajectories (prompts identical to GRPO's); a
:class:`~methods.core.teacher.Teacher` -- the same architecture with some
weight source -- re-reads each trajectory with a privileged context and scores
the student's tokens; the student minimises a divergence between its
next-token distributions and the teacher's at its own agent tokens
(:mod:`methods.divergences`, token-mean).  A method says which teacher
(``teacher_source``, ``ema_rate``), which divergence, and -- in
:meth:`SelfDistillation.teacher_contexts` -- what each rollout's privileged
context is; a rollout whose context is None gets no signal.

At its first step a run also measures what the teacher can give
(``teacher_context_gain``, logged once): the mean per-token log-likelihood of
the scripted expert's actions on that step's tasks under the teacher with the
method's contexts (each distinct task-context pair of the step once) minus
without them; a method that builds several kinds of context (SDPO) also logs it
per kind.  Beside it, on the student's own failed attempts of that step, the
same difference on their actions (``teacher_failed_shift``).  That one has no
sign to pass: the attempts were sampled from the teacher's own weights without
the context, so any context tends to lower them (at temperature 1 by exactly
the KL between the two on average); its size says how far the context moves the teacher on
the student's samples, i.e. how much signal there is at all, and the expert
gain says whether it points to the right actions.  Near zero or negative means the warm start cannot read that
context, and the method has nothing to distil.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tasks.base import Task, format_trace

from ..divergences import divergence, known_divergences, token_mean
from .batch import RolloutBatch
from .lazy import lazy_import, no_grad
from .registry import Method, MethodConfig
from .teacher import WEIGHT_SOURCES, Teacher

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")  # loaded on first use: config resolution reads this module (methods/core/lazy.py)

__all__ = [
    "DivergenceConfig",
    "DistillConfig",
    "SelfDistillation",
    "distill_loss",
    "distill_rows",
    "context_gain",
    "failed_attempt_shift",
    "gain_record",
]


@dataclass
class DivergenceConfig(MethodConfig):
    """The divergence a distillation loss uses (:func:`distill_loss`)."""

    group_size: int = 1  # distillation needs no groups: B tasks x 1 rollout
    divergence: str = "forward_kl"  # any registered one: forward_kl | reverse_kl | jsd | topk_tail | ...
    jsd_beta: float = 0.5
    topk: int = 20  # M of topk_tail
    topk_support: str = "teacher"  # teacher (LOPD's code) | student (TRL's SDPO port)

    def __post_init__(self):
        super().__post_init__()
        if self.divergence not in known_divergences():
            raise ValueError(f"divergence must be one of {list(known_divergences())}, got {self.divergence!r}")
        if not (0 <= self.jsd_beta <= 1) or self.topk < 1 or self.topk_support not in ("teacher", "student"):
            raise ValueError("jsd_beta must be in [0, 1], topk >= 1 and topk_support 'teacher' or 'student'")


@dataclass
class DistillConfig(DivergenceConfig):
    """A text-context self-distillation method: the divergence and where the teacher's weights come from."""

    teacher_source: str = "frozen"  # frozen | ema | student
    ema_rate: float = 0.0  # for teacher_source "ema"

    def __post_init__(self):
        super().__post_init__()
        if self.teacher_source not in WEIGHT_SOURCES:
            raise ValueError(f"teacher_source must be one of {list(WEIGHT_SOURCES)}, got {self.teacher_source!r}")
        if self.teacher_source == "ema" and not (0 < self.ema_rate <= 1):
            raise ValueError(f"ema_rate must be in (0, 1] for an EMA teacher, got {self.ema_rate}")


def distill_rows(batch: RolloutBatch) -> torch.Tensor:
    """The rollouts distillation learns from: those with ``extras["teacher_signal"]``."""
    return torch.nonzero(batch.extras["teacher_signal"]).flatten()


def distill_loss(cfg: DivergenceConfig, batch: RolloutBatch, rows: torch.Tensor, logits: torch.Tensor):
    """Token-mean divergence between the student's ``logits`` at its agent tokens of ``rows`` and
    the teacher's (``extras["teacher_logits"]``, detached): every distillation method's loss."""
    teacher = torch.cat([batch.extras["teacher_logits"][i] for i in rows.tolist()])
    per_token = divergence(cfg.divergence, logits, teacher, beta=cfg.jsd_beta, m=cfg.topk, support=cfg.topk_support)
    loss = token_mean(per_token)
    return loss, {"distill_div": float(loss.detach())}


def expert_trace(domain, task: Task) -> str:
    """The task's reference solution as an action -> result trace (the scripted expert's episode)."""
    return format_trace(task, domain.expert_trajectory(task).turns, with_task=False)


class SelfDistillation(Method):
    """Base class: subclasses set ``Config`` and implement :meth:`teacher_contexts`."""

    def __init__(self, cfg: DistillConfig, run):
        super().__init__(cfg, run)
        self.teacher = Teacher(run, cfg.teacher_source, cfg.ema_rate)
        self._gain_logged = False
        self._expert: dict[str, str] = {}

    def teacher_contexts(self, batch: RolloutBatch) -> list[str | None]:
        raise NotImplementedError

    def teacher_contexts_and_kinds(self, batch: RolloutBatch) -> tuple[list[str | None], list[str | None] | None]:
        """The contexts, and what each is made of when a method builds more than one kind
        (SDPO: a sibling or feedback only; None: one kind).  The kinds only split the logged
        sanity check."""
        return self.teacher_contexts(batch), None

    def expert_contexts(self, batch: RolloutBatch) -> list[str | None]:
        """Each rollout's task's reference solution / demonstration (:func:`expert_trace`, cached per task)."""
        for r in batch.rollouts:
            if r.task.task_id not in self._expert:
                self._expert[r.task.task_id] = expert_trace(self.run.domain, r.task)
        return [self._expert[r.task.task_id] for r in batch.rollouts]

    def prepare(self, batch: RolloutBatch) -> dict[str, float]:
        contexts, kinds = self.teacher_contexts_and_kinds(batch)
        scores = self.teacher.score(batch.rollouts, contexts, self.run.train_cfg.temperature)
        batch.extras["teacher_logits"] = scores
        signal = torch.tensor(
            [s is not None and c is not None for s, c in zip(scores, contexts)], device=batch.rewards.device
        )
        batch.extras["teacher_signal"] = signal
        out = {"signal_share": float(signal.float().mean())}
        if not self._gain_logged:
            self._gain_logged = True
            out.update(gain_record(self.teacher, batch.rollouts, contexts, kinds))
            out["teacher_context_gain"] = checked_gain(self.name, out["teacher_context_gain"])
        return out

    def trainable_rows(self, batch: RolloutBatch) -> torch.Tensor:
        return distill_rows(batch)

    def loss(self, batch, rows, logp, logits):
        return distill_loss(self.cfg, batch, rows, logits)

    def after_step(self, batch: RolloutBatch) -> dict[str, float]:
        self.teacher.update()
        return {}

    def state_dict(self):
        return {"teacher": self.teacher.state_dict(), "gain_logged": self._gain_logged}

    def load_state_dict(self, state) -> None:
        self.teacher.load_state_dict(state["teacher"])
        self._gain_logged = state["gain_logged"]


def checked_gain(method: str, gain: float) -> float:
    """The sanity check of every privileged-context method: say so in the log when the
    context does not raise the expert actions' likelihood under the teacher (then the
    method has little to distil, and the warm start cannot read that kind of context)."""
    if gain <= 0:
        print(
            f"[{method}] warning: the teacher's privileged context changes the expert actions' log-likelihood "
            f"by {gain:+.4f} nats/token "
            "(<= 0): the warm start cannot use this context, so distillation has little to give",
            file=sys.stderr,
            flush=True,
        )
    return gain


def gain_record(
    teacher: Teacher, rollouts: Sequence, contexts: Sequence[str | None], kinds: Sequence[str | None] | None = None
) -> dict[str, float]:
    """The sanity check on a step's own contexts: :func:`context_gain` over the distinct
    (task, context) pairs of ``rollouts`` (``teacher_context_gain``, ``teacher_context_pairs``)
    and, given each context's kind, the same per kind (``teacher_context_gain_<kind>``,
    ``teacher_context_pairs_<kind>``).  A method whose contexts are one per task scores
    each task once."""

    def pairs(sel):
        uniq = {(r.task.task_id, c): r.task for r, c in sel if c is not None}
        return list(uniq.values()), [c for _, c in uniq]

    tasks, ctxs = pairs(zip(rollouts, contexts))
    out = {"teacher_context_gain": context_gain(teacher, tasks, ctxs), "teacher_context_pairs": len(tasks)}
    out.update(failed_attempt_shift(teacher, rollouts, contexts))
    for kind in sorted({k for k in kinds or () if k is not None}):
        sel = [(r, c) for r, c, k in zip(rollouts, contexts, kinds or ()) if k == kind]
        tasks, ctxs = pairs(sel)
        out[f"teacher_context_gain_{kind}"] = context_gain(teacher, tasks, ctxs)
        out[f"teacher_context_pairs_{kind}"] = len(tasks)
        out.update({f"{k}_{kind}": v for k, v in failed_attempt_shift(teacher, *zip(*sel)).items()})
    return out


def failed_attempt_shift(teacher: Teacher, rollouts: Sequence, contexts: Sequence[str | None]) -> dict[str, float]:
    """On the student's own failed attempts (reward < 1) that have a context: the mean per-token
    log-likelihood of their actions under the teacher with the context minus without
    (``teacher_failed_shift``) and how many attempts (``teacher_failed_attempts``).  Empty when no
    failed attempt has a context.

    A magnitude, not a pass/fail: while the teacher's weights are the sampling policy's (step 1)
    a context tends to lower the likelihood of that policy's own samples whatever it says (at
    temperature 1 the expected change is exactly minus the KL from the policy to the teacher
    with the context; the runs sample at the training temperature, so only roughly), so
    ~0 means the teacher ignores the context (nothing to distil) and a large drop means it reacts
    to it; :func:`context_gain` says whether the reaction points to the right actions."""
    items = [(r.task, c, r.episode.turns) for r, c in zip(rollouts, contexts) if c is not None and r.reward < 1.0]
    return (
        {"teacher_failed_shift": _context_shift(teacher, items), "teacher_failed_attempts": len(items)} if items else {}
    )


def context_gain(teacher: Teacher, tasks: Sequence[Task], contexts: Sequence[str | None]) -> float:
    """Mean per-token log-lik of the expert's actions with the context minus without (tasks with a context).

    The warm start's own context check (:func:`methods.core.evaluate.mean_agent_logprob`) on the teacher."""
    items = [(t, c, teacher.run.domain.expert_trajectory(t).turns) for t, c in zip(tasks, contexts) if c is not None]
    return _context_shift(teacher, items) if items else 0.0


@no_grad
def _context_shift(teacher: Teacher, items: Sequence) -> float:
    """Mean per-token log-lik of the agent turns of ``items`` = [(task, context, turns)] under the
    teacher with their contexts minus without."""
    from .evaluate import mean_agent_logprob  # heavy (transformers): imported when a run measures

    run, model = teacher.run, teacher.model
    was_training = model.training
    with_ctx = mean_agent_logprob(model, run.encoder, run.domain, items)
    without = mean_agent_logprob(model, run.encoder, run.domain, [(t, None, turns) for t, _, turns in items])
    model.train(was_training)
    return with_ctx - without
