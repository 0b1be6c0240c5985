"""BFCL multi-turn as an evaluation-only domain (tasks/bfcl.py): BFCL's simulators, scored by BFCL's own checker."""

from __future__ import annotations

import decimal
import functools
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tasks.bfcl as bfcl
from tasks.base import known_domains

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def domain():
    return bfcl.BFCLMultiTurnDomain()


@functools.cache
def _task(task_id="multi_turn_base_0"):
    return next(t for t in bfcl.BFCLMultiTurnDomain().tasks("test") if t.task_id == task_id)


@pytest.fixture
def outside(monkeypatch, tmp_path):
    """Records every attempt to reach outside the process (the simulators catch exceptions, so
    raising would not show); runs the test in an empty working directory."""
    reached = []
    monkeypatch.chdir(tmp_path)
    for owner, name in [(socket.socket, "connect"), (subprocess.Popen, "__init__"), (os, "system"), (os, "getcwd")]:
        monkeypatch.setattr(owner, name, lambda *args, _name=name, **kwargs: reached.append(_name))
    yield reached
    assert list(tmp_path.iterdir()) == []


def test_every_gold_answer_replays_to_reward_one(domain, outside):
    """The acceptance test: the gold calls of all 200 conversations, replayed through the domain's
    episodes, satisfy BFCL's checker -- without touching the network, subprocesses or the disk."""
    tasks = domain.tasks("test")
    failures = {}
    for task in tasks:
        episode = domain.expert_trajectory(task)
        info = episode.info()
        if not episode.done or episode.reward() != 1.0:
            failures[task.task_id] = episode.feedback()
        assert info["format_errors"] == 0 and info["user_turns_reached"] == info["user_turns"]
    assert len(tasks) == 200 and not failures, failures
    assert outside == []


def test_tasks_are_the_benchmark_conversations(domain):
    tasks = domain.tasks("test")
    assert "bfcl_multiturn" in known_domains() and bfcl.BFCL_VERSION in domain.version
    assert [t.task_id for t in tasks[:2]] == ["multi_turn_base_0", "multi_turn_base_1"]
    assert len({t.task_id for t in tasks}) == 200 and domain.tasks("test", 3) == tasks[:3]
    first = tasks[0]
    assert first.group_id == "GorillaFileSystem+TwitterAPI" and first.template_id == first.task_id
    assert first.max_turns == 5 * len(first.payload["entry"]["question"]) == 20
    assert first.prompt.endswith(
        "Move 'final_report.pdf' within document directory to 'temp' directory in document. "
        "Make sure to create the directory"
    )
    assert (
        "```python" in first.prompt and "cd(folder: str)" in first.prompt and "post_tweet(content: str" in first.prompt
    )
    assert "ls(a: bool = False)" in first.prompt and "echo(content: str, file_name: str = None)" in first.prompt
    assert (
        first.reference.splitlines()[1] == "turn 2: cd(folder='temp'); grep(file_name='final_report.pdf', "
        "pattern='budget analysis')"
    )


@pytest.mark.parametrize("split", ["train", "warmstart", "dev"])
def test_non_test_splits_raise(domain, split):
    with pytest.raises(ValueError, match="evaluation-only"):
        domain.tasks(split)


def test_episode_walks_the_user_turns(domain):
    task = domain.tasks("test", 1)[0]
    episode = domain.reset(task)
    result = episode.step("Let me look first.\ncd(folder='document')\nls()")
    assert not result.done and result.observation.splitlines() == [
        'cd(folder=\'document\') -> {"current_working_directory": "document"}',
        'ls() -> {"current_directory_content": ["final_report.pdf", "previous_report.pdf"]}',
    ]
    result = episode.step("Both reports are there.")
    assert result.observation == task.payload["entry"]["question"][1][0]["content"] and not result.done
    assert episode.decoded == [[["cd(folder='document')", "ls()"]], []]
    assert episode.info() == {"user_turns_reached": 2, "user_turns": 4, "calls": 2, "format_errors": 0}


def test_wrong_calls_score_zero_with_the_checkers_reason(domain):
    """Each of BFCL's checks fails a wrong conversation: no calls in a turn that needs some, a wrong
    state, a missing result; an episode cut off before the last user turn is force-terminated."""
    task = domain.tasks("test", 1)[0]

    def run(actions):  # None: the expert's action
        episode = domain.reset(task)
        for action in actions:
            episode.step(episode.expert_action() if action is None else action)
        while not episode.done:
            episode.step(episode.expert_action())
        return episode

    silent = run(["Done."])
    assert silent.reward() == 0.0 and silent.feedback().startswith("multi_turn:empty_turn_model_response")
    wrong_dir = run(["cd(folder='document')\nmkdir(dir_name='tmp')\nmv(source='final_report.pdf', destination='tmp')"])
    assert wrong_dir.reward() == 0.0 and wrong_dir.feedback().startswith("multi_turn:instance_state_mismatch")
    no_grep = run([None, None, "cd(folder='temp')", "Done."])
    assert no_grep.reward() == 0.0 and no_grep.feedback().startswith("multi_turn:execution_response_mismatch")

    cut = domain.reset(task)
    while not cut.done:
        cut.step("ls(")
    assert len(cut.turns) == task.max_turns and cut.reward() == 0.0
    assert cut.feedback().startswith("multi_turn:force_terminated") and cut.info()["format_errors"] == task.max_turns


def test_checker_runs_are_independent_and_leave_nothing_behind(domain):
    """BFCL's executor caches instances in its module's globals by model name and entry id:
    two episodes on one task score alike, and no instance outlives a checker run."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    task = domain.tasks("test", 1)[0]
    first, second = domain.expert_trajectory(task), domain.expert_trajectory(task)
    assert [t.observation for t in first.turns] == [t.observation for t in second.turns]
    assert first.reward() == second.reward() == 1.0 and first.feedback() == ""
    assert bfcl.run_checker(first.decoded, task.payload["ground_truth"], task.payload["entry"]) == {"valid": True}
    assert not [k for k in vars(multi_turn_utils) if k.startswith("lopd_bench")]


HOSTILE = [
    ("__import__('os').system('touch pwned')", "bare name"),
    ("```python\nimport os\nos.system('ls')\n```", "only function calls"),
    ("os.system('ls')", "bare name"),
    ("cd(folder='document'", "could not parse"),
    ("cd(folder='document'))", "could not parse"),
    ("```python\ncd(folder=__import__('os').getcwd())\n```", "literals"),
    ("cd(folder=pwd())", "literals"),
    ("ls(**{'a': True})", "write every argument"),
    ("```python\nx = ls()\n```", "only function calls"),
    ("eval('1')", "unknown function"),
    ("cd(folder='a')\nrm_rf(path='/')", "unknown function"),
    ("ls()\n" * 6000, "longer than"),
    ("ls()\n" * 21, "at most 20"),
    ("```python\n" + "(" * 500 + ")" * 500 + "\n```", "could not parse"),
    ("tail(file_name='a', lines=1e999)", "literals"),
]


@pytest.mark.parametrize(("action", "reason"), HOSTILE)
def test_malformed_and_hostile_text_is_an_error_observation(domain, outside, action, reason):
    episode = domain.reset(_task())
    result = episode.step(action)
    assert result.observation.startswith("Error: ") and reason in result.observation and not result.done
    assert "Nothing was run" in result.observation and episode.decoded == [[]] and episode.info()["calls"] == 0
    assert len(result.observation) < 1000 and outside == []


def test_arbitrary_precision_is_bounded_and_its_globals_restored(domain):
    import mpmath

    episode = domain.reset(_task("multi_turn_base_15"))
    for action in [
        "power(base=10, exponent=1000000000)",
        "logarithm(value=2, base=10, precision=100000)",
        "square_root(number=2, precision=100000)",
    ]:
        assert "over this environment's limit" in episode.step(action).observation
    dps, prec = mpmath.mp.dps, decimal.getcontext().prec
    observation = episode.step("logarithm(value=2.0, base=10.0, precision=40)\nsquare_root(number=2, precision=50)")
    assert "0.301029995663981195213738894724493026768" in observation.observation
    assert "1.4142135623730950488016887242096980785696718753769" in observation.observation
    assert (mpmath.mp.dps, decimal.getcontext().prec) == (dps, prec)


def test_long_results_are_clipped_in_the_observation(domain):
    episode = domain.reset(_task("multi_turn_base_1"))
    calls = [
        "touch(file_name='big.txt')",
        f"echo(content='{'x' * 5000}', file_name='big.txt')",
        "cat(file_name='big.txt')",
    ]
    episode.step("```python\n" + "\n".join(calls) + "\n```")
    observation = episode.turns[-1].observation
    assert "more characters]" in observation and len(observation) < 3000


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=300) | st.text(alphabet="cdls()[]=,'\"`\n pytho", max_size=80))
def test_no_text_makes_a_step_raise(action):
    episode = bfcl.BFCLMultiTurnDomain().reset(_task())
    result = episode.step(action)
    assert episode.turns[-1].action == action and isinstance(result.observation, str | None)
    assert 0.0 <= episode.reward() <= 1.0


FUNCTIONS = {"cd": lambda folder: None, "ls": lambda a=False: None, "sort": lambda file_name: None}


@pytest.mark.parametrize(
    ("text", "calls"),
    [
        ("Done.", []),
        ("The folder holds two files: report.pdf and notes.txt.", []),
        ("cd(folder='document')", ["cd(folder='document')"]),
        ("Sure.\n  cd(folder='a')\nls(a=True)\nThat's all.", ["cd(folder='a')", "ls(a=True)"]),
        ("```python\ncd(\n    folder='a b',\n)\nls()  # list\n```", ["cd(folder='a b')", "ls()"]),
        ("```py\n    cd(folder='x')\n    sort('f.txt')\n```\nthen more text", ["cd(folder='x')", "sort('f.txt')"]),
        ("[cd(folder='a'), ls(a=True)]", ["cd(folder='a')", "ls(a=True)"]),
        ('```python\ncd(folder="it\'s")\n```', ['cd(folder="it\'s")']),
        ("```python\ncd(folder='a')\n```\n```python\nls()\n```", ["cd(folder='a')", "ls()"]),
        ("```python\ncd(folder='unclosed')", ["cd(folder='unclosed')"]),
        ("```\nnot code, a listing\n```", []),
        ("cd(folder=[1, {'k': (2.5, None)}], x=-3)", ["cd(folder=[1, {'k': (2.5, None)}], x=-3)"]),
    ],
)
def test_calls_are_parsed_from_python_blocks_or_lines(text, calls):
    assert [str(c) for c in bfcl.parse_calls(text, FUNCTIONS)] == calls


def test_parsed_calls_keep_positional_and_literal_values():
    (call,) = bfcl.parse_calls("sort('a.txt', file_name=True)", FUNCTIONS)
    assert (call.name, call.args, call.kwargs) == ("sort", ("a.txt",), (("file_name", True),))
    with pytest.raises(bfcl.CallFormatError, match="unknown function 'mv'"):
        bfcl.parse_calls("```python\nmv(source='a', destination='b')\n```", FUNCTIONS)


def test_the_checker_needs_no_llm_sdk():
    """bfcl-eval's model registry imports every LLM SDK; this domain imports nothing of it."""
    code = (
        "import sys, tasks.bfcl as b\n"
        "d = b.BFCLMultiTurnDomain(); t = d.tasks('test', 1)[0]\n"
        "assert d.expert_trajectory(t).reward() == 1.0\n"
        "assert 'bfcl_eval.constants.model_config' not in sys.modules\n"
        "assert not {'openai', 'anthropic'} & set(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
