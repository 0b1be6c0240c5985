"""The code domain: generation, splits, conventions and sandboxed scoring."""

from __future__ import annotations

import re
import time

import pytest

from tasks.base import get_domain
from tasks.code import FAMILIES, TEMPLATES, CodeDomain, extract_program

N_TRAIN = 400


@pytest.fixture(scope="module")
def domain():
    d = CodeDomain(seed=0, workers=2, cpu_s=1, wall_s=1.5)
    yield d
    d.close()


@pytest.fixture(scope="module")
def train(domain):
    return domain.tasks("train", N_TRAIN)


@pytest.fixture(scope="module")
def test_split(domain):
    return domain.tasks("test")


def run_programs(domain, tasks, programs):
    episodes = [domain.reset(t) for t in tasks]
    domain.step_batch(episodes, programs)
    return episodes


def test_registered_and_sized():
    d = get_domain("code", seed=0)
    assert d.version == "code-v1" and isinstance(d, CodeDomain)
    assert len(TEMPLATES) >= 20 and 8 <= len(FAMILIES) <= 16
    assert {t.family for t in TEMPLATES} == set(FAMILIES)


def test_default_sizes_and_speed():
    start = time.perf_counter()
    tasks = CodeDomain(seed=3).tasks("train")
    assert len(tasks) == 5000 and time.perf_counter() - start < 5
    assert len({t.prompt for t in tasks}) == 5000


def test_splits_deterministic_prefix_and_disjoint(domain, train, test_split):
    other = CodeDomain(seed=0)
    assert [(t.prompt, t.payload["tests"]) for t in other.tasks("train", 50)] == [
        (t.prompt, t.payload["tests"]) for t in train[:50]
    ]
    assert [t.prompt for t in CodeDomain(seed=1).tasks("train", 50)] != [t.prompt for t in train[:50]]
    assert len(test_split) == 300
    train_all = {t.prompt for t in domain.tasks("train")}
    assert not train_all & {t.prompt for t in test_split}
    templates = {t.name for t in TEMPLATES}
    assert {t.template_id for t in train} == templates == {t.template_id for t in test_split}
    assert {t.group_id for t in test_split} == set(FAMILIES)


def test_task_shape(train, test_split):
    for t in train + test_split:
        assert len(t.prompt) < 300 and "\ndef f(" in t.prompt and " == " in t.prompt
        lines = t.reference.rstrip("\n").split("\n")
        assert lines[0].startswith("def f(") and 2 <= len(lines) <= 4
        assert all(line.startswith("    ") for line in lines[1:])
        assert 5 <= len(t.payload["tests"]) <= 10 and t.max_turns == 1
        assert t.group_id == next(x.family for x in TEMPLATES if x.name == t.template_id)


def test_expert_passes_everything(domain, train, test_split):
    tasks = train + test_split
    episodes = run_programs(domain, tasks, [t.reference for t in tasks])
    failures = [(ep.task.template_id, ep.feedback()) for ep in episodes if ep.reward() != 1.0]
    assert not failures, failures[:5]
    assert all(ep.feedback() == "" and ep.done for ep in episodes)
    assert all(domain.expert_trajectory(t).reward() == 1.0 for t in test_split[:5])


def test_wrong_program_gets_informative_feedback(domain, train):
    task = train[0]
    ep = domain.reset(task)
    result = ep.step("def f(x):\n    return 12345\n")
    assert result.done and ep.reward() == 0.0
    fb = ep.feedback()
    assert fb.startswith("failed test") and "f(" in fb and "returned 12345, expected" in fb
    first_input = repr(task.payload["tests"][0][0][0])
    assert first_input in fb
    assert ep.info()["total"] == len(task.payload["tests"]) and ep.info()["reason"] == fb


def test_fences_are_stripped(domain, train):
    task = train[1]
    ep = domain.reset(task)
    ep.step(f"```python\n{task.reference}```")
    assert ep.reward() == 1.0
    assert extract_program("```\nx = 1\n```") == "x = 1\n"
    assert extract_program("def f(x): pass") == "def f(x): pass"


# A tiny convention-free variant of a reference, per family.
_DROP_LINE = {
    "lower": r"\n    s = s\.lower\(\)",
    "strip": r"\n    s = s\.strip\(\)",
    "abs": r"\n    (xs|n) = .*abs\(.*",
    "nozero": r"\n    xs = \[x for x in xs if x != 0\]",
    "empty": r"\n    if not xs:\n        return -1",
    "sorted": r"\n    xs = sorted\(xs\)",
}
_UNWRAP = {
    "desc": r"sorted\((.*), reverse=True\)",
    "first3": r"(.*)\[:3\]",
    "uniq": r"list\(dict\.fromkeys\((.*)\)\)",
    "cap": r"min\((.*), 100\)",
    "floor0": r"max\((.*), 0\)",
}


def convention_free(task) -> str:
    family = task.group_id
    if family in _DROP_LINE:
        program, n = re.subn(_DROP_LINE[family], "", task.reference)
    else:
        program, n = re.subn(r"return " + _UNWRAP[family] + r"\n", r"return \1\n", task.reference)
    assert n == 1, (family, task.reference)
    return program


def test_conventions_matter(domain, train, test_split):
    assert set(_DROP_LINE) | set(_UNWRAP) == set(FAMILIES)
    tasks = train[:200] + test_split[:100]
    episodes = run_programs(domain, tasks, [convention_free(t) for t in tasks])
    assert all(ep.reward() == 0.0 for ep in episodes), [ep.task.reference for ep in episodes if ep.reward()][:3]
    assert {ep.task.group_id for ep in episodes} == set(FAMILIES)


def test_visible_examples_hide_the_convention(domain, train):
    """The convention-free program agrees with every visible example."""
    for task in train[:200]:
        namespace: dict = {}
        exec(convention_free(task), namespace)
        for line in task.prompt.split("\n")[2:]:
            call, expected = line.split(" == ")
            assert eval(call, {"f": namespace["f"]}) == eval(expected), (task.prompt, task.reference)


def test_step_batch_matches_sequential_step(domain, train):
    tasks = train[:12]
    programs = [[t.reference, convention_free(t), "oops(", "def f(x):\n    while True: pass\n"][k % 4] for k, t in enumerate(tasks)]
    programs[3] = programs[7] = "def f(x):\n    return None\n"  # one slow program is enough
    batched = run_programs(domain, tasks, programs)
    sequential = []
    for t, p in zip(tasks, programs):
        ep = domain.reset(t)
        ep.step(p)
        sequential.append(ep)
    assert [e.reward() for e in batched] == [e.reward() for e in sequential]
    assert [e.feedback() for e in batched] == [e.feedback() for e in sequential]
    assert [e.reward() for e in batched][:4] == [1.0, 0.0, 0.0, 0.0]


def test_step_after_done_is_harmless(domain, train):
    ep = domain.reset(train[0])
    ep.step(train[0].reference)
    assert ep.step("garbage").done and ep.reward() == 1.0 and len(ep.turns) == 1
