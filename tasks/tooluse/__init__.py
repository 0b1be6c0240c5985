"""Tool use: procedurally generated stateful tool environments (EnvScaler-like).

Four kinds (bank, inventory, calendar, library), each in 8 train variants
plus 2 test-only variants that rename the tools (listed in a fixed role
order per kind), reorder their arguments (shown in the signatures), change
the short id format and add hidden rules the instruction never states
(approvals above a threshold, cents, required scans / inspections /
confirmations / logs / member cards).  Every variant has a rule that touches
most of its tasks, and breaking one yields an error naming the call needed,
so past trajectories from the same variant (``Task.group_id``) carry what
the task line lacks.  Names are written verbatim as the instruction spells
them.  One call per turn, ``tool(arg, ...)``, and ``done`` to finish; the
reward is the fraction of end-state checks that hold.

v2 (``tooluse-v2``) over v1: no name-form rules, canonical tool order, short
ids and observations, shorter prompts, a majority-touching rule per variant.
v3 (``tooluse-v3``) over v2: 8 train and 2 test-only variants per kind (was 40
and 10), 10 % of test tasks on
test-only variants (was 20 %), and an imperfect, rule-unaware demonstrator
(:meth:`ToolUseDomain.imperfect_trajectory`) for the warm start
(``docs/testbed.md``).
"""

from __future__ import annotations

import re
from pathlib import Path

from ..base import Episode, Task, TaskDomain, register_domain
from ..cache import cached, source_digest
from .episode import ToolEpisode
from .generate import make_task

#: what the tasks are generated from: a cached split is reused only while these are unchanged
_SOURCES = source_digest([*Path(__file__).parent.rglob("*.py"), Path(__file__).parents[1] / "base.py"])

__all__ = ["ToolUseDomain", "ToolEpisode"]

_DEFAULT_N = {"train": 5000, "test": 300, "warmstart": 40000}
_NEEDS = re.compile(r"error:(?: over \S+)? needs (.+) first")


@register_domain
class ToolUseDomain(TaskDomain):
    name = "tooluse"
    version = "tooluse-v3"
    system_prompt = "Use the tools, one call per turn, like name(arg, arg). Reply done when the task is finished."

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        if split not in _DEFAULT_N:
            raise ValueError(f"unknown split {split!r}; expected one of {', '.join(_DEFAULT_N)}")
        count = _DEFAULT_N[split] if n is None else n
        if count < 1000:  # a test split builds in 0.05 s; the cache is for the 5,000-task training split
            return [make_task(self.seed, split, i) for i in range(count)]
        return cached(
            "tooluse_tasks",
            (self.seed, split, count),
            _SOURCES,
            lambda: [make_task(self.seed, split, i) for i in range(count)],
        )

    def reset(self, task: Task) -> Episode:
        return ToolEpisode(task)

    def imperfect_trajectory(self, task: Task, rng, recovery: float) -> Episode:
        """The rule-unaware demonstrator: it carries out the instruction's calls (the template's
        intent, without the steps the variant's hidden rules demand), and when a call breaks a
        rule ("error: needs scan(s-61) first") it makes the named call and retries with
        probability ``recovery``, else moves on to its next call, losing that step's checks.
        The cue is the error observation, the same in every variant, so a policy that learns to
        recover does better on every environment, seen or not."""
        ep = ToolEpisode(task)
        intent = [ep.variant.render(step) for step in task.payload["intent"]] + ["done"]
        i = 0
        while i < len(intent) and not ep.done:
            obs = ep.step(intent[i]).observation or ""
            fix = _NEEDS.fullmatch(obs)
            if fix and not ep.done and rng.random() < recovery:
                ep.step(fix.group(1))  # the named call, then the same call again
                continue
            i += 1
        return ep
