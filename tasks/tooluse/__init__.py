"""Tool use: procedurally generated stateful tool environments (EnvScaler-like).

Four kinds (bank, inventory, calendar, library), each in 40 train variants
plus 10 test-only variants that rename the tools (listed in a fixed role
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
"""

from __future__ import annotations

from ..base import Episode, Task, TaskDomain, register_domain
from .episode import ToolEpisode
from .generate import make_task

__all__ = ["ToolUseDomain", "ToolEpisode"]

_DEFAULT_N = {"train": 5000, "test": 300, "warmstart": 40000}


@register_domain
class ToolUseDomain(TaskDomain):
    name = "tooluse"
    version = "tooluse-v2"
    system_prompt = "Use the tools, one call per turn, like name(arg, arg). Reply done when the task is finished."

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        if split not in _DEFAULT_N:
            raise ValueError(f"unknown split {split!r}; expected one of {', '.join(_DEFAULT_N)}")
        count = _DEFAULT_N[split] if n is None else n
        return [make_task(self.seed, split, i) for i in range(count)]

    def reset(self, task: Task) -> Episode:
        return ToolEpisode(task)
