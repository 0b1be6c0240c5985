"""HumanEval as an evaluation-only domain (tasks/humaneval.py): the benchmark's own checks, in the sandbox."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tasks.base import get_domain, known_domains
from tasks.humaneval import load_problems, pass_at_k, program


@pytest.fixture(scope="module")
def domain():
    d = get_domain("humaneval")
    yield d
    d.close()


def _scores(domain, answers):
    tasks = domain.tasks("test")
    episodes = [domain.reset(t) for t in tasks]
    domain.step_batch(episodes, answers(tasks, episodes))
    return {t.task_id: (ep.reward(), ep.feedback()) for t, ep in zip(tasks, episodes)}


def test_every_canonical_solution_passes_as_a_whole_function_or_a_body(domain):
    """All 164 reference programs score 1 through the domain (as root, the child runs as nobody):
    fenced whole functions (the expert's action) and bare bodies (a completion of the prompt)."""
    assert "humaneval" in known_domains() and len(load_problems()) == 164
    whole = _scores(domain, lambda tasks, eps: [ep.expert_action() for ep in eps])
    assert len(whole) == 164 and all(r == 1.0 for r, _ in whole.values()), {
        k: f for k, (r, f) in whole.items() if r < 1
    }
    bodies = {p["task_id"]: p["canonical_solution"] for p in load_problems()}
    body = _scores(domain, lambda tasks, eps: [bodies[t.task_id] for t in tasks])
    assert all(r == 1.0 for r, _ in body.values()), {k: f for k, (r, f) in body.items() if r < 1}


def test_wrong_and_hostile_answers_score_zero_with_the_reason(domain):
    tasks = domain.tasks("test", 3)
    answers = [
        "```python\ndef has_close_elements(numbers, threshold):\n    return None\n```",
        "    import socket\n    socket.socket()\n",
        "def (:",
    ]
    episodes = [domain.reset(t) for t in tasks]
    domain.step_batch(episodes, answers)
    assert [ep.reward() for ep in episodes] == [0.0, 0.0, 0.0]
    assert all(ep.done and ep.feedback() for ep in episodes)
    assert "refused" in episodes[1].feedback()
    assert "syntax" in episodes[2].feedback().lower()


def test_answers_become_programs():
    prompt = 'def f(x):\n    """Double x."""\n'
    assert program(prompt, "f", "    return 2 * x\n") == prompt + "    return 2 * x\n"
    whole = program(prompt, "f", "Here:\n```python\nimport math\n\ndef f(x):\n    return 2 * x\n```\nDone.")
    assert whole.endswith("import math\n\ndef f(x):\n    return 2 * x\n") and whole.startswith(prompt.rstrip())
    namespace = {}
    exec(whole, namespace)  # the redefinition wins over the prompt's stub
    assert namespace["f"](3) == 6


def test_evaluation_only():
    d = get_domain("humaneval")
    for split in ("train", "warmstart"):
        with pytest.raises(ValueError, match="evaluation-only"):
            d.tasks(split)
    t = d.tasks("test", 1)[0]
    assert t.task_id == "HumanEval/0" and t.max_turns == 1 and "def has_close_elements" in t.prompt


@given(st.lists(st.tuples(st.integers(1, 30), st.integers(0, 30)), min_size=1, max_size=5), st.integers(1, 10))
def test_pass_at_k_is_the_unbiased_estimator(pairs, k):
    n = [max(a, k) for a, _ in pairs]
    c = [min(b, m) for (_, b), m in zip(pairs, n)]
    expected = sum(1 - math.comb(m - j, k) / math.comb(m, k) for m, j in zip(n, c)) / len(n)
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_needs_k_samples():
    with pytest.raises(ValueError, match="at least 10 samples"):
        pass_at_k([5], [1], 10)
