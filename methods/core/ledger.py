"""The budget ledger: what a run spent, recorded the same way for every method.

The unit of budget is one student rollout (methods.md, "Budgets").  Teacher
scoring is compute, not rollouts, and is counted separately as teacher-scored
tokens, next to distinct tasks seen, generated tokens and wall time; token passes
through student, teacher and composer (forward and backward) give the
compute-matched view (``analysis/compute.py``).
``pre_rollouts`` are the warm-start policy's rollouts that seeded an experience
bank before training (retrieval RL, LOPD): not student training rollouts, but
recorded with every run that used them so the comparison shows them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

#: the token-pass counters every method shares; a method adds its own networks' (LOPD's composer) by
#: declaring them (``Method.pass_counters``), and every ledger carries every registered method's
PASS_FIELDS = (
    "rollout_tokens",
    "student_fwd_tokens",
    "student_bwd_tokens",
    "teacher_bwd_tokens",
)


def _method_counters() -> dict[str, int]:
    from .registry import declared_pass_counters

    return dict.fromkeys((c for c in declared_pass_counters() if c not in PASS_FIELDS), 0)


@dataclass
class Ledger:
    rollout_budget: int
    rollouts: int = 0
    steps: int = 0
    generated_tokens: int = 0
    teacher_tokens: int = 0
    pre_rollouts: int = 0
    wall_s: float = 0.0
    eval_wall_s: float = 0.0  # of wall_s, spent in held-out evaluations (the same work for every method)
    # token passes through each network (compute, beside the rollout budget): one token through one
    # forward (fwd) or backward (bwd) pass; rollout_tokens: every token of the sampled sequences
    # (prompt prefill, observations and generated tokens).  teacher_tokens is the teacher's forward.
    rollout_tokens: int = 0
    student_fwd_tokens: int = 0
    student_bwd_tokens: int = 0
    teacher_bwd_tokens: int = 0
    #: the methods' own counters (``Method.pass_counters``), by name
    method_passes: dict[str, int] = field(default_factory=_method_counters)
    _tasks: set[str] = field(default_factory=set)
    _t0: float | None = None

    @property
    def tasks_seen(self) -> int:
        return len(self._tasks)

    @property
    def remaining(self) -> int:
        return self.rollout_budget - self.rollouts

    def start_clock(self) -> None:
        self._t0 = time.perf_counter()

    def tick(self) -> None:
        now = time.perf_counter()
        if self._t0 is not None:
            self.wall_s += now - self._t0
        self._t0 = now

    def add_rollouts(self, task_ids: list[str], generated_tokens: int) -> None:
        if self.rollouts + len(task_ids) > self.rollout_budget:
            raise RuntimeError(f"rollout budget exceeded: {self.rollouts} + {len(task_ids)} > {self.rollout_budget}")
        self.rollouts += len(task_ids)
        self._tasks.update(task_ids)
        self.generated_tokens += generated_tokens

    def add_teacher_tokens(self, n: int) -> None:
        self.teacher_tokens += int(n)

    def add_passes(self, **tokens: int) -> None:
        """Count token passes, e.g. ``add_passes(student_fwd_tokens=n, student_bwd_tokens=n)``."""
        for name, n in tokens.items():
            if name in PASS_FIELDS:
                setattr(self, name, getattr(self, name) + int(n))
            elif name in self.method_passes:
                self.method_passes[name] += int(n)
            else:
                known = ", ".join((*PASS_FIELDS, *self.method_passes))
                raise KeyError(
                    f"unknown token-pass counter {name!r}; known: {known} (a method declares its own in pass_counters)"
                )

    def add_eval_time(self, seconds: float) -> None:
        self.eval_wall_s += float(seconds)

    def snapshot(self) -> dict[str, Any]:
        return {
            "rollouts": self.rollouts,
            "rollout_budget": self.rollout_budget,
            "tasks_seen": self.tasks_seen,
            "steps": self.steps,
            "generated_tokens": self.generated_tokens,
            "teacher_tokens": self.teacher_tokens,
            "pre_rollouts": self.pre_rollouts,
            "wall_s": round(self.wall_s, 3),
            "eval_wall_s": round(self.eval_wall_s, 3),
            **{name: getattr(self, name) for name in PASS_FIELDS},
            **self.method_passes,
        }

    def state_dict(self) -> dict[str, Any]:
        return {**self.snapshot(), "tasks": sorted(self._tasks)}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        for k in ("rollouts", "steps", "generated_tokens", "teacher_tokens", "wall_s"):
            setattr(self, k, s[k])
        self.pre_rollouts = s.get("pre_rollouts", self.pre_rollouts)
        self.eval_wall_s = s.get("eval_wall_s", 0.0)
        for name in PASS_FIELDS:
            setattr(self, name, s.get(name, 0))
        for name in self.method_passes:
            self.method_passes[name] = s.get(name, 0)
        self._tasks = set(s["tasks"])
