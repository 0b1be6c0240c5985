"""The one small interface every task domain implements.

A *domain* (``tasks/tooluse``, ``tasks/code``, later real benchmarks) is a
:class:`TaskDomain` registered by name.  It hands out deterministic train/test
splits of :class:`Task` objects and opens :class:`Episode` objects on them.  An
episode is a turn-based exchange: the agent sends one action string per turn,
the environment answers with an observation string, until the episode is done.
The reward is in ``[0, 1]``; on failure ``feedback`` carries the text that
SDPO-style teachers use (tool errors, failing test output).

Everything a method needs about a task is here and nowhere else:

* ``Task.prompt``       -- the user message the student sees (tools + instruction);
* ``Task.group_id``     -- what experience shares (tool-use variant, code family);
* ``Task.reference``    -- a reference solution, for teachers that need one (OPSD);
* ``Episode.expert_action()`` -- the scripted expert, used for warm-start
  demonstrations and for SDFT demonstrations.

Conventions shared by all domains (so no method is favoured by formatting):

* a privileged or retrieved *context block* is rendered by
  :func:`render_user_message` in one neutral format, ahead of the task;
* a finished trajectory is rendered by :func:`format_trace` as a compact
  action -> result trace (what experience banks and reference contexts show).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

__all__ = [
    "BenchmarkDomain",
    "Task",
    "StepResult",
    "Episode",
    "TaskDomain",
    "Turn",
    "register_domain",
    "get_domain",
    "known_domains",
    "render_user_message",
    "format_trace",
]


@dataclass(frozen=True)
class Task:
    """One task instance. Immutable and cheap to pass around.

    ``payload`` holds domain-private data (initial state, hidden tests, ...);
    methods must not read it.
    """

    task_id: str  # unique within (domain, version)
    domain: str
    split: str  # "train" | "test"
    template_id: str  # the task template that generated it
    group_id: str  # environment variant (tool use) or problem family (code)
    prompt: str  # user message the student sees, without any context block
    reference: str  # reference solution as text (oracle calls / program)
    max_turns: int  # assistant turns allowed in an episode
    payload: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)


@dataclass
class StepResult:
    observation: str | None  # text shown to the agent next (None when done and nothing to show)
    done: bool


@dataclass
class Turn:
    """One assistant action and the environment's answer to it."""

    action: str
    observation: str | None


class Episode(abc.ABC):
    """A running episode on one task.  Never raises on bad agent input:
    malformed or hostile actions become error observations or reward 0."""

    def __init__(self, task: Task):
        self.task = task
        self.turns: list[Turn] = []
        self.done = False

    @abc.abstractmethod
    def step(self, action: str) -> StepResult:
        """Apply one agent action.  Must append to ``self.turns`` and set ``self.done``."""

    @abc.abstractmethod
    def reward(self) -> float:
        """Outcome reward in [0, 1]; valid once ``done`` (0-ish before)."""

    @abc.abstractmethod
    def feedback(self) -> str:
        """Environment feedback on failure (empty string on full success)."""

    @abc.abstractmethod
    def expert_action(self) -> str:
        """What the scripted expert does next from the current state."""

    def info(self) -> dict[str, Any]:
        """Extra per-episode diagnostics (e.g. number of tool errors)."""
        return {}


class TaskDomain(abc.ABC):
    """A family of tasks with deterministic splits.

    Subclasses set ``name`` and ``version``; ``version`` must change whenever
    the generated data or the scoring changes (tables refuse to mix versions).
    """

    name: ClassVar[str]
    version: ClassVar[str]
    #: the system message every episode of this domain starts with
    system_prompt: ClassVar[str] = ""

    def __init__(self, seed: int = 0, **options: Any):
        self.seed = seed
        self.options = options

    def system_message(self) -> str:
        """The system message episodes start with; the option ``system_prompt: false``
        drops it (the small profile does: a constant prefix teaches a tiny model
        nothing and costs a quarter of every sequence)."""
        return self.system_prompt if self.options.get("system_prompt", True) else ""

    @abc.abstractmethod
    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        """The first ``n`` tasks of ``split``, deterministic in ``self.seed``.
        ``n=None`` returns the domain's default split size.

        Splits: ``train`` and ``test`` (the methods' world: test holds unseen
        tasks on the train split's groups plus a share of unseen groups), and
        ``warmstart``: tasks on fresh groups (environment variants / projects),
        a few tasks each, that no other split contains -- the stand-in for
        pretraining data (``methods/stages/warmstart.py``).  A domain loaded from
        a real benchmark may have no ``warmstart`` split; a real model needs none."""

    @abc.abstractmethod
    def reset(self, task: Task) -> Episode:
        """Open a fresh episode on ``task``."""

    def step_batch(self, episodes: Sequence[Episode], actions: Sequence[str]) -> list[StepResult]:
        """Step many episodes at once.  Domains whose step is expensive (code:
        sandboxed execution) override this to run them in parallel."""
        return [ep.step(a) for ep, a in zip(episodes, actions)]

    def expert_trajectory(self, task: Task) -> Episode:
        """Run the scripted expert to the end of an episode on ``task``."""
        ep = self.reset(task)
        while not ep.done and len(ep.turns) < task.max_turns:
            ep.step(ep.expert_action())
        return ep

    def imperfect_trajectory(self, task: Task, rng, recovery: float) -> Episode:
        """A demonstration by an *imperfect* demonstrator, for the warm start's demonstrations
        without a context block (the stand-in for pretraining data with systematic mistakes that
        reward reveals, the headroom RL works on).  ``recovery`` is how often it reacts correctly
        to the cue its mistakes depend on.  Domains without one return the expert's."""
        return self.expert_trajectory(task)

    def close(self) -> None:  # noqa: B027 (optional hook: most domains hold nothing to release)
        """Release resources (worker pools)."""


class BenchmarkDomain(TaskDomain):
    """An evaluation-only domain on a published benchmark (HumanEval, BFCL): one split, ``test``.

    Nothing from a held-out benchmark may enter training, a bank or a warm start, so asking for any
    other split is an error.  Subclasses build their tasks once, in :meth:`load_tasks`."""

    _benchmark_tasks: list[Task] | None = None

    @abc.abstractmethod
    def load_tasks(self) -> list[Task]:
        """Every task of the benchmark, in its own order."""

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        if split != "test":
            raise ValueError(
                f"{self.name} is an evaluation-only domain: its one split is 'test', not {split!r} "
                "(nothing from a held-out benchmark may enter training, a bank or a warm start)"
            )
        if self._benchmark_tasks is None:
            self._benchmark_tasks = self.load_tasks()
        return self._benchmark_tasks if n is None else self._benchmark_tasks[:n]


# --------------------------------------------------------------------------- registry
_DOMAINS: dict[str, type[TaskDomain]] = {}


def register_domain(cls: type[TaskDomain]) -> type[TaskDomain]:
    name = cls.name
    if name in _DOMAINS and _DOMAINS[name] is not cls:
        raise ValueError(f"task domain {name!r} is already registered by {_DOMAINS[name].__module__}")
    _DOMAINS[name] = cls
    return cls


def known_domains() -> list[str]:
    _import_builtin_domains()
    return sorted(_DOMAINS)


def get_domain(name: str, seed: int = 0, **options: Any) -> TaskDomain:
    _import_builtin_domains()
    if name not in _DOMAINS:
        raise unknown_name("task", name, _DOMAINS)
    return _DOMAINS[name](seed=seed, **options)


def unknown_name(kind: str, name: str, known) -> KeyError:
    """The error for an unknown name in any registry: a "did you mean" hint and the known names."""
    import difflib

    known = sorted(known)
    hint = difflib.get_close_matches(name, known, n=1)
    extra = f" (did you mean {hint[0]!r}?)" if hint else ""
    return KeyError(f"unknown {kind} {name!r}{extra}; known {kind}s: {', '.join(known)}")


def _import_builtin_domains() -> None:
    import importlib

    for mod in ("tasks.tooluse", "tasks.code", "tasks.humaneval", "tasks.bfcl"):
        importlib.import_module(mod)


# --------------------------------------------------------------------------- rendering
CONTEXT_HEADER = "context:"
TASK_HEADER = "task:"


def render_user_message(task: Task, context: str | None = None) -> str:
    """The user message: an optional neutral context block, then the task.

    Every privileged-context method (OPSD, SDPO, SDFT, Skill-SD, retrieval RL)
    and the warm start use this one format, so none is favoured by it.
    """
    if not context:
        return task.prompt
    return f"{CONTEXT_HEADER}\n{context.strip()}\n\n{TASK_HEADER}\n{task.prompt}"


def format_trace(task: Task, turns: Sequence[Turn], with_task: bool = True) -> str:
    """A finished trajectory as a compact action -> result trace."""
    lines = [task.prompt] if with_task else []
    for t in turns:
        lines.append(f"> {t.action.strip()}")
        if t.observation:
            lines.append(f"< {t.observation.strip()}")
    return "\n".join(lines)
