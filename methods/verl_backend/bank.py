"""Retrieval RL's experience bank in a verl run: one bank per run, served by a named Ray actor.

The suite's retrieval RL (:mod:`methods.retrieval_rl`) puts the top-n successful trajectories of
*other* training tasks, retrieved from the experience bank, ahead of the task in the student's
prompt, and grows the bank with the run's successes after every step.  In verl the episodes are
played by agent-loop workers in many processes, and the step is run by the trainer, so the bank
lives in one place that both reach, a named Ray actor holding a :class:`BankService`:

* the agent loop (:class:`methods.verl_backend.agent_loop.EpisodeAgentLoop`) asks it for the
  context of each episode's task (:meth:`BankService.contexts`), and after a *training* episode
  hands it the trajectory (:meth:`BankService.stage`); a held-out episode retrieves but never
  stages, and the bank refuses any task outside the training split
  (:class:`methods.experience.bank.LeakError`);
* the trainer (:class:`methods.verl_backend.trainer.RetrievalTrainer`) commits the staged
  trajectories once the step's update is done (:meth:`BankService.commit`), so that, as in the
  suite's loop, a step's rollouts see the bank as it was when the step began, and saves the bank
  with each checkpoint, so that a resumed run retrieves from the bank it had at that step.

The bank itself is the suite's :class:`~methods.experience.bank.ExperienceBank` with its text
encoder, its seed file (the ``bank`` rule's) and its settings (``max_per_task``,
``success_threshold``), so that retrieval and admission are those of the suite's own runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from methods.core.settings import BankConfig
from methods.experience.bank import LeakError
from tasks.base import Turn

from .actors import ActorClient, named_client
from .export import task_of_row

__all__ = ["BankService", "BankClient", "start_bank", "bank_client", "retrieval_settings"]

#: the ``main_ppo`` config's section for the suite's settings that verl does not know
SECTION = "lopd_bench"


def retrieval_settings(config) -> dict | None:
    """The ``lopd_bench.retrieval`` section of a ``main_ppo`` config (None: the method retrieves nothing)."""
    section = config.get(SECTION) if config is not None else None
    retrieval = section.get("retrieval") if section is not None else None
    return dict(retrieval) if retrieval else None


class BankService:
    """The bank and the trajectories staged since the last commit (module docstring)."""

    def __init__(
        self,
        bank_config: dict | None = None,
        seed_path: str | None = None,
        n_retrieve: int = 3,
        allow_self_retrieval: bool = False,
    ):
        from methods.experience import ExperienceBank
        from methods.experience.encoder import TextEncoder

        self.bank = ExperienceBank(BankConfig(**(bank_config or {})), TextEncoder(), allow_self_retrieval)
        if seed_path:
            self.bank.load(seed_path)
            self.bank.frozen = False  # a seed bank grows during training
        self.n_retrieve = int(n_retrieve)
        self.pending: list[tuple[Any, list[Turn], float]] = []
        self._domains: dict = {}

    def contexts(self, rows: Sequence[dict]) -> list[str | None]:
        """The student's context block for the task of each row (``extra_info`` as exported), as
        :meth:`methods.retrieval_rl.RetrievalRL.student_contexts` renders it."""
        from methods.retrieval_rl import render_experience

        tasks = [task_of_row(row, self._domains)[1] for row in rows]
        return [render_experience(hits) for hits in self.bank.retrieve_each(tasks, self.n_retrieve)]

    def stage(self, row: dict, turns: Sequence[Sequence[str | None]], reward: float) -> None:
        """Keep a finished training episode (its ``(action, observation)`` turns) for the next
        commit.  A task outside the training split is refused here, before it could wait."""
        _, task = task_of_row(row, self._domains)
        if task.split != "train":
            raise LeakError(f"task {task.task_id} is from the {task.split!r} split; it may not enter the bank")
        self.pending.append((task, [Turn(a, o) for a, o in turns], float(reward)))

    def commit(self, step: int) -> dict[str, float]:
        """Add the staged trajectories that qualify; returns the step's bank metrics."""
        staged, self.pending = self.pending, []
        # agent loops finish in no fixed order; with max_per_task, the order decides which success of
        # a task enters, so it is made independent of timing (task, then best reward, then the text)
        staged.sort(key=lambda x: (x[0].task_id, -x[2], [(t.action, t.observation or "") for t in x[1]]))
        added = self.bank.add(staged, step=step)
        return {"bank/staged": len(staged), "bank/added": added, "bank/size": len(self.bank)}

    def save(self, path: str) -> None:
        """Write the bank (atomically; pending trajectories are not part of it)."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.bank.save(path)

    def load(self, path: str) -> int:
        self.bank.load(path)
        self.bank.frozen = False
        self.pending = []
        return len(self.bank)

    def size(self) -> int:
        return len(self.bank)


def start_bank(settings: dict):
    """The run's bank actor (``settings`` is :func:`retrieval_settings`' section), created by the
    trainer before any episode is played; agent loops find it by name (:func:`bank_client`)."""
    import ray

    return (
        ray.remote(BankService)
        .options(name=settings["actor"], num_cpus=0, max_concurrency=1)
        .remote(
            bank_config=dict(settings.get("bank_config") or {}),
            seed_path=settings.get("seed"),
            n_retrieve=int(settings.get("n_retrieve", 3)),
            allow_self_retrieval=bool(settings.get("allow_self_retrieval", False)),
        )
    )


class BankClient(ActorClient):
    """What an agent loop needs of the bank, as awaitables (:class:`.actors.ActorClient`)."""

    async def context(self, row: dict) -> str | None:
        return (await self._call("contexts", [row]))[0]

    async def stage(self, row: dict, turns, reward: float) -> None:
        await self._call("stage", row, [(t.action, t.observation) for t in turns], reward)


def bank_client(settings: dict) -> BankClient:
    """The client of the run's bank actor (looked up by name once per process)."""
    return named_client(settings["actor"], BankClient)
