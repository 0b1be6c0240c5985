"""Skill-SD's skill library in a verl run: one library per run, served by a named Ray actor.

The suite's Skill-SD (:mod:`methods.skill_sd`) picks one skill per task and step by UCB1 over the
skills of the task's group, lets a teacher (the student itself, synced every step) score the
student's response after that skill, records the outcome of the task's rollouts as the skill's
reward, and after the step summarises every finished rollout into a new skill.  In verl the
episodes are played by agent-loop workers in many processes, so the library lives in one place
they all reach, a named Ray actor holding a :class:`SkillService` (as retrieval RL's bank does,
:mod:`methods.verl_backend.bank`):

* the agent loop asks it for the skill of each *training* episode's task
  (:meth:`SkillService.choose`): the first episode of a task in a step makes the UCB1 choice, and
  the task's other rollouts of that step get the same skill, as in the suite, where the choice is
  made once per task and batch; after the episode it stages the outcome
  (:meth:`SkillService.stage`);
* the trainer (:class:`methods.verl_backend.trainer.SkillTrainer`) commits after the step's
  update (:meth:`SkillService.commit`): each chosen skill is credited with the mean reward of its
  task's rollouts, then the staged rollouts are summarised into skills, so that, as in the suite,
  a step's choices see the library as it was when the step began.

The library, its UCB1 rule and the summariser are the suite's own (:class:`methods.skill_sd.SkillLibrary`,
:func:`methods.core.contexts.skill_summary`).  One difference: the suite adds a step's skills in
the batch's order, and verl's episodes finish in no fixed order, so the staged rollouts are sorted
(task, then best reward, then the actions) before they are summarised; which skill of a group is
"untried first" can therefore differ from the suite's loop on the same rollouts, never between two
verl runs of the same rollouts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from methods.core.contexts import SKILL_MAX_CHARS, skill_summary
from methods.experience.bank import LeakError

from .actors import ActorClient, named_client
from .bank import SECTION
from .export import task_of_row

__all__ = ["SkillService", "SkillClient", "start_skills", "skills_client", "skill_settings"]


def skill_settings(config) -> dict | None:
    """The ``lopd_bench.skills`` section of a ``main_ppo`` config (None: the run has no skill library)."""
    section = config.get(SECTION) if config is not None else None
    skills = section.get("skills") if section is not None else None
    return dict(skills) if skills else None


class SkillService:
    """The library, this step's choices, and the outcomes staged since the last commit (module docstring)."""

    def __init__(self, ucb_c: float = math.sqrt(2), max_skill_chars: int = SKILL_MAX_CHARS):
        from methods.skill_sd import SkillLibrary

        self.library = SkillLibrary()
        self.ucb_c, self.max_skill_chars = float(ucb_c), int(max_skill_chars)
        self.chosen: dict[str, int | None] = {}  # task id -> the skill its rollouts use this step
        self.pending: list[tuple] = []  # (task, actions, reward, feedback) of this step's training episodes
        self._domains: dict = {}

    def _train_task(self, row: dict):
        _, task = task_of_row(row, self._domains)
        if task.split != "train":
            raise LeakError(
                f"task {task.task_id} is from the {task.split!r} split; it has no place in the skill library"
            )
        return task

    def choose(self, row: dict) -> str | None:
        """The skill the teacher reads for this training task in this step (None: the task's group
        has no skill yet, and its rollouts get the GRPO term only)."""
        task = self._train_task(row)
        if task.task_id not in self.chosen:
            self.chosen[task.task_id] = self.library.select(task, self.ucb_c)
        idx = self.chosen[task.task_id]
        return None if idx is None else self.library.skills[idx].text

    def stage(self, row: dict, actions: Sequence[str], reward: float, feedback: str | None) -> None:
        """Keep a finished training episode's outcome for the next commit."""
        self.pending.append((self._train_task(row), list(actions), float(reward), feedback))

    def commit(self, step: int) -> dict[str, float]:
        """Credit this step's choices and add its rollouts' skills; returns the step's metrics."""
        staged, self.pending = self.pending, []
        chosen, self.chosen = self.chosen, {}
        staged.sort(
            key=lambda x: (x[0].task_id, -x[2], x[1], x[3] or "")
        )  # independent of which episode finished first
        rewards: dict[str, list[float]] = {}
        for task, _, reward, _ in staged:
            rewards.setdefault(task.task_id, []).append(reward)
        for task_id, idx in sorted(chosen.items()):
            if idx is not None and rewards.get(task_id):
                self.library.record(idx, sum(rewards[task_id]) / len(rewards[task_id]))
        with_skill = sum(chosen.get(task.task_id) is not None for task, *_ in staged)
        added = sum(
            self.library.add(skill_summary(actions, reward >= 1.0, feedback, self.max_skill_chars), task.group_id)
            for task, actions, reward, feedback in staged
        )
        return {
            "skills/staged": len(staged),
            "skills/added": added,
            "skills/size": len(self.library.skills),
            "skills/share": with_skill / len(staged) if staged else 0.0,
        }

    def save(self, path: str) -> None:
        """Write the library (atomically; this step's choices and staged outcomes are not part of it)."""
        from methods.core.provenance import write_text_atomic

        write_text_atomic(Path(path), json.dumps({"library": self.library.state_dict()}))

    def load(self, path: str) -> int:
        self.library.load_state_dict([tuple(s) for s in json.loads(Path(path).read_text())["library"]])
        self.chosen, self.pending = {}, []
        return len(self.library.skills)

    def size(self) -> int:
        return len(self.library.skills)


def start_skills(settings: dict):
    """The run's skill-library actor (``settings`` is :func:`skill_settings`' section), created by the
    trainer before any episode is played; agent loops find it by name (:func:`skills_client`)."""
    import ray

    return (
        ray.remote(SkillService)
        .options(name=settings["actor"], num_cpus=0, max_concurrency=1)
        .remote(ucb_c=float(settings["ucb_c"]), max_skill_chars=int(settings["max_skill_chars"]))
    )


class SkillClient(ActorClient):
    """What an agent loop needs of the library, as awaitables (:class:`.actors.ActorClient`)."""

    async def choose(self, row: dict) -> str | None:
        return await self._call("choose", row)

    async def stage(self, row: dict, episode) -> None:
        await self._call("stage", row, [t.action for t in episode.turns], float(episode.reward()), episode.feedback())


def skills_client(settings: dict) -> SkillClient:
    """The client of the run's skill-library actor (looked up by name once per process)."""
    return named_client(settings["actor"], SkillClient)
