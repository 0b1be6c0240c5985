"""Tool use: procedurally generated stateful tool environments (EnvScaler-like).

Four kinds (bank, inventory, calendar, library), each in 40 train variants
plus 10 test-only variants that rename and reorder the tools, change the id
format and add hidden rules the instruction never states (approval
thresholds, cents, name forms, required confirmations).  Past trajectories
from the same variant (``Task.group_id``) demonstrate those rules.  One call
per turn, ``tool(arg, ...)``, and ``done`` to finish; the reward is the
fraction of end-state checks that hold.
"""

from __future__ import annotations

from ..base import Episode, Task, TaskDomain, register_domain
from .episode import ToolEpisode
from .generate import make_task

__all__ = ["ToolUseDomain", "ToolEpisode"]

_DEFAULT_N = {"train": 5000, "test": 300}


@register_domain
class ToolUseDomain(TaskDomain):
    name = "tooluse"
    version = "tooluse-v1"
    system_prompt = "Use the tools, one call per turn, like name(arg, arg). Reply done when the task is finished."

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        if split not in _DEFAULT_N:
            raise ValueError(f"unknown split {split!r}; expected 'train' or 'test'")
        count = _DEFAULT_N[split] if n is None else n
        return [make_task(self.seed, split, i) for i in range(count)]

    def reset(self, task: Task) -> Episode:
        return ToolEpisode(task)
