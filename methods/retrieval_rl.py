"""Retrieval RL: GRPO with retrieved experience in the *student's* context.

The control that asks whether LOPD's gain is only retrieval
(``docs/methods.md``).  Everything is GRPO (:mod:`methods.grpo`:
G rollouts per task, group-standardised outcome advantages, PPO-clip loss),
except the student's prompt: ahead of the task it carries the top-n
(default 3) successful trajectories of *other* training tasks retrieved from
the experience bank (:mod:`methods.experience`), as text, in the neutral
context format every method shares (:func:`tasks.base.render_user_message`).
The same retrieval runs at test time, from the training bank (test tasks never
enter it).  The bank starts from the warm-start policy's own successes (the
``bank`` rule; ``bank.seed_tasks``) and grows with the run's successes after
every step; it is saved in the run's checkpoint.

LOPD differs in where the experience goes: into latent tokens that condition a
frozen teacher, while its student's prompt stays GRPO's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from tasks.base import Task

from .core.registry import register_method
from .core.settings import BankConfig
from .grpo import GRPO, GRPOConfig


@dataclass
class RetrievalRLConfig(GRPOConfig):
    n_retrieve: int = 3  # top-n trajectories in the student's context (LOPD's n_ret)
    allow_self_retrieval: bool = False  # the reference code's behaviour; off: a task never sees its own trajectory

    def __post_init__(self):
        super().__post_init__()
        if self.n_retrieve < 1:
            raise ValueError(f"n_retrieve must be >= 1, got {self.n_retrieve}")


def render_experience(hits) -> str | None:
    """The context block of retrieved experiences (None when nothing was retrieved)."""
    return "\n\n".join(e.document() for e in hits) if hits else None


@register_method("retrieval_rl")
class RetrievalRL(GRPO):
    Config = RetrievalRLConfig
    uses_bank = True

    def __init__(self, cfg: RetrievalRLConfig, run):
        from .experience import ExperienceBank
        from .experience.encoder import TextEncoder  # numpy, faiss: not needed to read the Config

        super().__init__(cfg, run)
        self.bank = ExperienceBank(
            BankConfig(**(run.bank_config or {})), TextEncoder(), allow_self_retrieval=cfg.allow_self_retrieval
        )
        if run.bank_path:
            self.bank.load(run.bank_path)
            self.bank.frozen = False  # a seed bank grows during training
        self._last = {"retrieved": 0.0, "same_group": 0.0, "retrieval_s": 0.0}

    def student_contexts(self, tasks: Sequence[Task]) -> list[str | None]:
        from .experience.bank import same_group_share

        # one retrieval per distinct task (the loop repeats each task G times)
        t0 = time.perf_counter()
        distinct = list({t.task_id: t for t in tasks}.values())
        got = self.bank.retrieve(distinct, self.cfg.n_retrieve)
        hits = {t.task_id: h for t, h in zip(distinct, got)}
        self._last = {
            "retrieved": sum(len(h) for h in got) / max(len(got), 1),
            "same_group": same_group_share(distinct, got),
            "retrieval_s": time.perf_counter() - t0,
        }
        return [render_experience(hits[t.task_id]) for t in tasks]

    def prepare(self, batch):
        out = super().prepare(batch)
        out.update(
            {
                "retrieved_per_task": self._last["retrieved"],
                "retrieved_same_group": self._last["same_group"],
                "retrieval_s": round(self._last["retrieval_s"], 4),
            }
        )
        return out

    def after_step(self, batch) -> dict[str, float]:
        t0 = time.perf_counter()
        added = self.bank.add_rollouts(batch.rollouts, step=self.run.ledger.steps)
        return {"bank_added": added, "bank_size": len(self.bank), "bank_add_s": round(time.perf_counter() - t0, 4)}

    def state_dict(self):
        return {"bank": self.bank.state_dict()}

    def load_state_dict(self, state) -> None:
        self.bank.load_state_dict(state["bank"])
