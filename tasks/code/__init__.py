"""The code-synthesis domain: write a short Python function ``f`` from a
one-line description and 1-2 examples, for a named project.

Problems come from the grammar in ``families.py`` (list/string/number
templates, and projects that each carry one or two unstated conventions,
independent of the template) via the deterministic generator in
``generator.py``.  The prompt's first line names the project
(``project: Velmora``, a pseudo-word); ``Task.group_id`` is the project id, so experience from
the same project carries what the task line lacks: the project's convention.
Some projects appear only in the test split.  An episode has up to ``attempts``
turns (domain option, default 2): each action is a program, which runs against
6-8 hidden tests in the isolated sandbox (``tasks/sandbox.py``).  A passing
program ends the episode; a failing one gets the sandbox's account of the first
failing test (input, output, expected, and the name of the test: the project
rule it checks, if any) or the error/timeout as its observation, and the agent
may submit a revised program.  Reward is 1 iff the last program
passes every test; the feedback on a failure is what SDPO-style teachers
condition on.  ``step_batch`` sends a whole batch of programs through the
sandbox pool at once, since that is the hot path during training.

The imperfect demonstrator (:meth:`CodeDomain.imperfect_trajectory`, the warm
start's demonstrations without a context block) writes the program the task
line asks for and ignores the project's unstated conventions; when the failing
test names one (``failed test 3: f([]) returned 0, expected -1 (project rule: an
empty list returns -1)``) it writes the project's program with probability
``recovery``, else submits the same program again.  The cue, a failing test, looks the same in every
project, seen or not, so learning to act on it is headroom that transfers (docs/testbed.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from tasks.base import Episode, StepResult, Task, TaskDomain, Turn, register_domain
from tasks.cache import cached, source_digest
from tasks.code.families import CONVENTIONS, PROJECTS, TEMPLATES, render_reference
from tasks.code.generator import applied_conventions, generate, project_templates
from tasks.sandbox import ExecResult, Sandbox, default_sandbox

#: what the splits are generated from: a cached split is reused only while these are unchanged
_SOURCES = source_digest([*Path(__file__).parent.glob("*.py"), Path(__file__).parents[1] / "base.py"])

__all__ = [
    "CodeDomain",
    "SandboxJudged",
    "CodeEpisode",
    "extract_program",
    "CONVENTIONS",
    "PROJECTS",
    "TEMPLATES",
    "applied_conventions",
    "project_templates",
]

_TEMPLATES = {t.name: t for t in TEMPLATES}
_DEFAULT_SIZES = {"train": 5000, "test": 300, "warmstart": 40000}
_FENCE = re.compile(r"```[a-zA-Z0-9_+-]*[ \t]*\n?(.*?)(?:```|\Z)", re.DOTALL)


def extract_program(action: str) -> str:
    """The program text of an action, without surrounding ``` fences."""
    match = _FENCE.search(action)
    return match.group(1) if match else action


class CodeEpisode(Episode):
    """Up to ``task.max_turns`` programs, each one sandboxed run of the hidden tests."""

    def __init__(self, task: Task, domain: CodeDomain):
        super().__init__(task)
        self._domain = domain
        self._result: ExecResult | None = None

    def job(self, action: str) -> tuple:
        return (extract_program(action), "f", self.task.payload["tests"])

    def step(self, action: str) -> StepResult:
        if self.done:
            return StepResult(None, True)
        return self.record(action, self._domain.sandbox().run_tests([self.job(action)])[0])

    def record(self, action: str, result: ExecResult) -> StepResult:
        """Record the sandbox's verdict on ``action``; a pass or the last attempt ends the episode."""
        self._result = result
        observation = f"all {result.total} tests passed" if result.ok else self._domain.failure_text(self.task, result)
        self.turns.append(Turn(action, observation))
        self.done = result.ok or len(self.turns) >= self.task.max_turns
        return StepResult(observation, self.done)

    def reward(self) -> float:
        r = self._result
        if r is None:
            return 0.0
        if r.ok:
            return 1.0
        if self._domain.reward_mode == "test_fraction":  # the share of hidden tests the last program passed
            return r.passed / r.total if r.total else 0.0
        return 0.0

    def feedback(self) -> str:
        if self._result is None:
            return "no program submitted"
        return "" if self._result.ok else self.turns[-1].observation

    def expert_action(self) -> str:
        return self.task.reference

    def info(self) -> dict[str, Any]:
        r = self._result
        if r is None:
            return {"passed": 0, "total": len(self.task.payload["tests"]), "reason": "not run"}
        return {"passed": r.passed, "total": r.total, "reason": r.reason}


class SandboxJudged:
    """For domains whose episodes are judged by the sandbox pool (code, HumanEval): the pool, a batch
    of programs sent through it at once, and its release.  Episodes provide ``job(action)`` (what to
    run) and ``record(action, result)`` (the verdict).  The options ``workers``, ``cpu_s``, ``wall_s``
    and ``mem_mb`` give the domain its own pool, over ``sandbox_defaults``; without them and without
    defaults it shares the process-wide one."""

    sandbox_defaults: ClassVar[dict[str, Any] | None] = None
    _own_sandbox: Sandbox | None = None
    options: dict[str, Any]

    def sandbox(self) -> Sandbox:
        given = {k: self.options[k] for k in ("workers", "cpu_s", "wall_s", "mem_mb") if k in self.options}
        if not given and self.sandbox_defaults is None:
            return default_sandbox()
        if self._own_sandbox is None:
            self._own_sandbox = Sandbox(**{**(self.sandbox_defaults or {}), **given})
        return self._own_sandbox

    def step_batch(self, episodes: Sequence[Episode], actions: Sequence[str]) -> list[StepResult]:
        """Run every still-open episode's program through the sandbox pool at once."""
        todo = [k for k, ep in enumerate(episodes) if not ep.done]
        results = self.sandbox().run_tests([episodes[k].job(actions[k]) for k in todo])
        out = [StepResult(None, True)] * len(episodes)
        for k, result in zip(todo, results):
            out[k] = episodes[k].record(actions[k], result)
        return out

    def close(self) -> None:
        if self._own_sandbox is not None:
            self._own_sandbox.close()
            self._own_sandbox = None


#: the code domain's ``reward`` option (CodeDomain's docstring)
REWARD_MODES = ("all_tests", "test_fraction")


@register_domain
class CodeDomain(SandboxJudged, TaskDomain):
    """Function synthesis with per-project hidden conventions.  Options: ``attempts``
    (programs per episode, default 2); ``reward``: ``all_tests`` (default: 1 when every hidden test
    passes, else 0) or ``test_fraction`` (the share of hidden tests the last program passed, 1 for
    all: a dense signal for a policy that rarely passes them all, e.g. a small pretrained model on
    tasks whose conventions it cannot know; success is still "all passed"); ``workers``,
    ``cpu_s``, ``wall_s``, ``mem_mb`` give this domain its own sandbox pool; without them it shares
    the process-wide default sandbox."""

    name = "code"
    version = "code-v6"
    system_prompt = "Write the Python function f. Reply with the code only."

    def __init__(self, seed: int = 0, **options: Any):
        super().__init__(seed, **options)
        self.attempts = int(options.get("attempts", 2))
        if self.attempts < 1:
            raise ValueError(f"code domain option attempts must be >= 1, got {self.attempts}")
        self.reward_mode = options.get("reward", "all_tests")
        if self.reward_mode not in REWARD_MODES:
            raise ValueError(f"code domain option reward must be one of {list(REWARD_MODES)}, got {self.reward_mode!r}")
        if self.reward_mode != "all_tests":  # a different score: tables must not mix it with the default's
            self.version = f"{type(self).version}+{self.reward_mode}"
        self._cache: dict[str, list[Task]] = {}

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        if split not in _DEFAULT_SIZES:
            raise ValueError(f"unknown split {split!r}; expected one of {', '.join(_DEFAULT_SIZES)}")
        n = _DEFAULT_SIZES[split] if n is None else n
        if len(self._cache.get(split, ())) < n:
            self._cache[split] = cached(  # 5,000 tasks: 2.7 s to generate, 0.1 s to load (tasks/cache.py)
                "code_tasks",
                (self.name, self.seed, split, n, self.attempts),
                _SOURCES,
                lambda: [self._task(split, i, t) for i, t in enumerate(generate(self.seed, split, n))],
            )
        return self._cache[split][:n]

    def _task(self, split: str, i: int, t: dict) -> Task:
        return Task(
            task_id=f"code-{split}-{i:05d}",
            domain=self.name,
            split=split,
            template_id=t["template"].name,
            group_id=t["project"].id,
            prompt=t["prompt"],
            reference=t["reference"],
            max_turns=self.attempts,
            payload={
                "tests": t["tests"],
                "test_rules": t["test_rules"],
                "params": t["params"],
                "conventions": t["conventions"],
                "test_only_project": t["project"].test_only,
            },
        )

    def reset(self, task: Task) -> CodeEpisode:
        return CodeEpisode(task, self)

    @staticmethod
    def failure_text(task: Task, result: ExecResult) -> str:
        """The sandbox's account of a failure, with the failing test's name: the project rules it
        checks (``failed test 3: f([]) returned 0, expected -1 (project rule: an empty list
        returns -1)``), as a test suite with descriptive test names reports it."""
        rules = task.payload.get("test_rules")
        if result.failed_test is None or not rules or not rules[result.failed_test]:
            return result.reason
        return f"{result.reason} (project rule: {'; '.join(CONVENTIONS[c].doc for c in rules[result.failed_test])})"

    def imperfect_trajectory(self, task: Task, rng, recovery: float) -> Episode:
        """The convention-unaware demonstrator (module docstring): the task line's program, then,
        after a failing test, the project's program with probability ``recovery``, else the same
        program again."""
        ep = self.reset(task)
        naive = render_reference(_TEMPLATES[task.template_id], task.payload["params"], ())
        ep.step(naive)
        while not ep.done:
            ep.step(task.reference if rng.random() < recovery else naive)
        return ep
