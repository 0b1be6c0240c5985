"""The experience bank: successful training-split trajectories and dense retrieval over them.

Leak-free by construction:

* :meth:`ExperienceBank.add` raises :class:`LeakError` for a task of any split
  but ``train`` -- a test task can never enter, whatever the caller does;
* :meth:`ExperienceBank.retrieve` never returns the query task's own
  trajectories unless ``allow_self_retrieval`` (default off; the paper's
  reference code had it on) is set;
* a frozen bank (test time) refuses additions.

Each task keeps at most ``max_per_task`` trajectories (default 1, its first
success): G rollouts of one task that all succeed would otherwise fill the
top-n with near-copies of one solution.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from methods.core.settings import BankConfig
from tasks.base import Task, Turn, format_trace

from .encoder import TextEncoder
from .index import VectorIndex

__all__ = ["BankConfig", "Experience", "ExperienceBank", "LeakError", "same_group_share"]


def same_group_share(tasks: Sequence[Task], hits: Sequence[Sequence[Experience]]) -> float:
    """Share of retrieved items that come from their query task's own group (environment variant / project)."""
    return sum(e.group_id == t.group_id for t, h in zip(tasks, hits) for e in h) / max(sum(len(h) for h in hits), 1)


def _spread(keys: Sequence[str]) -> dict[str, int]:
    """Fewest, median and most items per key (among keys that have any)."""
    counts = sorted(Counter(keys).values())
    if not counts:
        return {"min": 0, "median": 0, "max": 0}
    return {"min": counts[0], "median": counts[len(counts) // 2], "max": counts[-1]}


class LeakError(ValueError):
    """A held-out task was about to enter the experience bank."""


def _check_split(task: Task) -> None:
    if task.split != "train":
        raise LeakError(
            f"task {task.task_id} is from the {task.split!r} split; "
            "only training-split trajectories may enter the experience bank"
        )


@dataclass(frozen=True)
class Experience:
    task_id: str
    template_id: str
    group_id: str
    task_text: str  # the task as the student saw it
    trace: str  # compact action -> result trace (format_trace without the task)
    reward: float
    step: int  # training step that produced it (-1: the bank's seed)
    turns: tuple[
        tuple[str, str | None], ...
    ] = ()  # the raw (action, observation) pairs (LOPD's cold start re-reads them token by token)

    def document(self) -> str:
        """Task + trajectory: what is embedded on the document side (the paper's version) and what a
        student is shown (the format of :func:`tasks.base.format_trace` with the task)."""
        return f"{self.task_text}\n{self.trace}"


class ExperienceBank:
    def __init__(self, cfg: BankConfig, encoder: TextEncoder, allow_self_retrieval: bool = False):
        self.cfg, self.encoder = cfg, encoder
        self.allow_self_retrieval = allow_self_retrieval
        self.items: list[Experience] = []
        self.index = VectorIndex(encoder.dim)
        self._per_task: dict[str, int] = {}
        self.frozen = False
        self.rejected = {"below_threshold": 0, "task_full": 0}

    def __len__(self) -> int:
        return len(self.items)

    # --- growing ---------------------------------------------------------------
    def candidate(self, task: Task, turns: Sequence[Turn], reward: float, step: int) -> Experience | None:
        """The experience this trajectory would add, or None if it does not qualify."""
        _check_split(task)
        if reward < self.cfg.success_threshold:
            self.rejected["below_threshold"] += 1
            return None
        if self._per_task.get(task.task_id, 0) >= self.cfg.max_per_task:
            self.rejected["task_full"] += 1
            return None
        return Experience(
            task.task_id,
            task.template_id,
            task.group_id,
            task.prompt,
            format_trace(task, turns, with_task=False),
            float(reward),
            step,
            tuple((t.action, t.observation) for t in turns),
        )

    def add(self, items: Sequence[tuple[Task, Sequence[Turn], float]], step: int) -> int:
        """Add the qualifying (task, turns, reward) trajectories; returns how many entered."""
        if self.frozen:
            raise RuntimeError("the experience bank is frozen (test time); it accepts no new trajectories")
        for task, _, _ in items:  # all or nothing: a leak anywhere leaves the bank untouched
            _check_split(task)
        new: list[Experience] = []
        for task, turns, reward in items:
            exp = self.candidate(task, turns, reward, step)
            if exp is not None:
                new.append(exp)
                self._per_task[task.task_id] = self._per_task.get(task.task_id, 0) + 1
        if new:
            self.index.add(self.encoder.encode([e.document() for e in new]))
            self.items += new
        return len(new)

    def add_rollouts(self, rollouts, step: int) -> int:
        return self.add([(r.task, r.episode.turns, r.reward) for r in rollouts], step)

    def seed(self, tasks: Sequence[Task], play, attempts: int = 1, chunk: int = 256, progress=None) -> list[int]:
        """Fill the bank before RL with the successes of ``play`` (a list of tasks -> their rollouts,
        one each) on ``tasks``: every task is tried once, then those still without a success in the
        bank again, up to ``attempts`` tries each (pass@k seeding; with ``max_per_task`` 1 a task
        keeps its first success).  Plays ``chunk`` tasks at a time and calls ``progress(attempt,
        tried, of)`` after each chunk.  Returns the number of rollouts of each attempt."""
        todo, per_attempt = list(tasks), []
        for attempt in range(attempts):
            if not todo:
                break
            tried = 0
            for start in range(0, len(todo), chunk):
                rollouts = play(todo[start : start + chunk])
                self.add_rollouts(rollouts, step=-1)
                tried += len(rollouts)
                if progress is not None:
                    progress(attempt, tried, len(todo))
            per_attempt.append(tried)
            todo = [t for t in todo if self._per_task.get(t.task_id, 0) == 0]
        return per_attempt

    def freeze(self) -> ExperienceBank:
        self.frozen = True
        return self

    # --- retrieval -------------------------------------------------------------
    def retrieve(self, tasks: Sequence[Task], n: int, allow_self: bool | None = None) -> list[list[Experience]]:
        """Top-``n`` experiences per task by cosine similarity of the task (query) to task+trajectory (documents).

        ``allow_self`` overrides the bank's ``allow_self_retrieval`` for this call (LOPD's cold start
        lets its training examples retrieve themselves but never its held-out ones)."""
        if not tasks:
            return []
        if len(self) == 0 or n <= 0:
            return [[] for _ in tasks]
        self_ok = self.allow_self_retrieval if allow_self is None else allow_self
        queries = self.encoder.encode_query([t.prompt for t in tasks])
        own = [0 if self_ok else self._per_task.get(t.task_id, 0) for t in tasks]
        k = min(len(self), n + max(own))
        _, rows = self.index.search(queries, k)
        out = []
        for task, row in zip(tasks, rows):
            hits = [self.items[j] for j in row if j >= 0 and (self_ok or self.items[j].task_id != task.task_id)]
            out.append(hits[:n])
        return out

    def retrieve_each(self, tasks: Sequence[Task], n: int) -> list[list[Experience]]:
        """:meth:`retrieve` per task of a batch that repeats tasks (one search per distinct task)."""
        distinct = list({t.task_id: t for t in tasks}.values())
        hits = dict(zip((t.task_id for t in distinct), self.retrieve(distinct, n)))
        return [hits[t.task_id] for t in tasks]

    # --- persistence -----------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "config": dataclasses.asdict(self.cfg),
            "items": [dataclasses.asdict(e) for e in self.items],
            "vectors": torch.from_numpy(self.index.vectors().copy()),
            "rejected": dict(self.rejected),
            "frozen": self.frozen,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        items = [Experience(**{**e, "turns": tuple(tuple(t) for t in e.get("turns", ()))}) for e in state["items"]]
        vectors = state["vectors"].numpy()
        if len(items) != len(vectors):
            raise ValueError(f"corrupt bank state: {len(items)} items but {len(vectors)} vectors")
        if vectors.shape[1] != self.encoder.dim:
            raise ValueError(
                f"bank vectors are {vectors.shape[1]}-d but the encoder makes {self.encoder.dim}-d vectors"
            )
        self.items, self.index = items, VectorIndex(self.encoder.dim)
        self.index.add(vectors)
        self._per_task = {}
        for e in items:
            self._per_task[e.task_id] = self._per_task.get(e.task_id, 0) + 1
        self.rejected = dict(state.get("rejected", self.rejected))
        self.frozen = bool(state.get("frozen", False))

    def save(self, path: str | Path) -> None:
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        torch.save(self.state_dict(), tmp)
        os.replace(tmp, path)

    def load(self, path: str | Path) -> ExperienceBank:
        self.load_state_dict(torch.load(path, map_location="cpu", weights_only=False))
        return self

    def stats(self) -> dict[str, Any]:
        return {
            "size": len(self),
            "tasks": len(self._per_task),
            "groups": len({e.group_id for e in self.items}),
            "items_per_group": _spread([e.group_id for e in self.items]),
            "rejected": dict(self.rejected),
        }
