"""An episode on one tool-use task: calls, reward from state checks, the expert.

The reward is the fraction of the task's checks (``(num, attr, expected)``
triples on the final state) that hold.  The scripted expert follows the
task's plan: it finds how far the successful calls so far have followed the
plan, in order, and issues the next step (or ``done``).
"""

from __future__ import annotations

from typing import Any

from ..base import Episode, StepResult, Task, Turn
from .calls import call_key, is_done
from .envs import Env
from .kinds import KINDS
from .spec import copy_state
from .variants import Variant, make_variant

__all__ = ["ToolEpisode", "describe_check"]


def describe_check(variant: Variant, num: int, attr: str, value: Any) -> str:
    """A check in words, as feedback shows it."""
    ident = variant.fmt_id(num)
    if attr == "bal":
        return f"{ident} balance should be {value * variant.unit}"
    if attr == "qty":
        return f"{ident} stock should be {value}"
    if attr in ("shelf", "day"):
        return f"{ident} should be on {attr} {value}"
    if attr == "label":
        return f"{ident} should be {value}"
    if attr == "active":
        return f"{ident} should be {variant.kind.gone}"
    if attr == "ok":
        return f"{ident} should be confirmed"
    if attr == "logged":
        return f"{ident} should be logged"
    if attr == "holder":
        return f"{ident} should be lent to {value}" if value else f"{ident} should be returned"
    return f"{ident} should be due day {value}"


class ToolEpisode(Episode):
    """One run of a tool-use task; never raises on agent input."""

    def __init__(self, task: Task):
        super().__init__(task)
        payload = task.payload
        self.variant = make_variant(KINDS[payload["kind"]], payload["variant"])
        self.env = Env(self.variant, copy_state(payload["state"]))
        self.plan = payload["plan"]
        self.checks = payload["checks"]
        self.errors: list[str] = []
        self.tool_calls = 0
        self.repeated_calls = 0
        self._seen_calls: set[str] = set()

    def step(self, action: str) -> StepResult:
        if self.done:
            return StepResult(None, True)
        action = action if isinstance(action, str) else str(action)
        if is_done(action):
            obs = self.env.finish()
            self.done = True
        else:
            self._count_call(action)
            obs = self.env.call(action)
        if obs and obs.startswith("error:"):
            self.errors.append(obs)
        self.turns.append(Turn(action, obs))
        if len(self.turns) >= self.task.max_turns:
            self.done = True
        return StepResult(obs, self.done)

    def _count_call(self, action: str) -> None:
        key = call_key(action)
        self.tool_calls += 1
        self.repeated_calls += key in self._seen_calls
        self._seen_calls.add(key)

    def _failed_checks(self) -> list[tuple[int, str, Any]]:
        ents = self.env.state["ents"]
        return [(n, a, v) for n, a, v in self.checks if n not in ents or ents[n].get(a) != v]

    def reward(self) -> float:
        return (len(self.checks) - len(self._failed_checks())) / len(self.checks)

    def feedback(self) -> str:
        failed = self._failed_checks()
        if not failed:
            return ""
        parts = []
        if self.errors:
            parts.append("errors: " + "; ".join(dict.fromkeys(e[len("error: ") :] for e in self.errors)))
        parts.append("failed: " + "; ".join(describe_check(self.variant, *c) for c in failed))
        return "\n".join(parts)

    def expert_action(self) -> str:
        done_steps = 0
        for step in self.env.executed:
            if done_steps < len(self.plan) and step == self.plan[done_steps]:
                done_steps += 1
        return self.variant.render(self.plan[done_steps]) if done_steps < len(self.plan) else "done"

    def info(self) -> dict[str, Any]:
        return {
            "tool_calls": self.tool_calls,
            "errors": len(self.errors),
            "repeated_calls": self.repeated_calls,
            "checks_passed": len(self.checks) - len(self._failed_checks()),
            "checks": len(self.checks),
        }
