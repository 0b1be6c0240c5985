"""The code domain: generation, splits, projects, conventions and sandboxed scoring."""

from __future__ import annotations

import re
from collections import defaultdict

import pytest

from tasks.base import get_domain
from tasks.code import CONVENTIONS, PROJECTS, TEMPLATES, CodeDomain, extract_program, project_templates

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
    assert d.version == "code-v6" and isinstance(d, CodeDomain)
    assert len(TEMPLATES) >= 20 and 8 <= len(CONVENTIONS) <= 16
    seen = [p for p in PROJECTS if not p.test_only]
    new = [p for p in PROJECTS if p.test_only]
    assert (
        len(seen) == 12
        and len(new) == 4
        and len({p.id for p in PROJECTS}) == len({p.name for p in PROJECTS}) == len(PROJECTS)
    )
    assert all(
        c in {x for p in seen for x in p.conventions} for c in CONVENTIONS
    )  # every convention in some train project
    assert all(len(p.conventions) == 2 for p in new)  # test-only projects: input+output pairs no train project has
    assert not {p.conventions for p in new} & {p.conventions for p in seen}
    assert any(len(p.conventions) == 2 for p in seen) and any(len(p.conventions) == 2 for p in new)
    assert all(len(project_templates(p)) >= 4 for p in PROJECTS)
    # every template is used by several projects with different conventions
    users = {t.name: {p.conventions for p in PROJECTS if t in project_templates(p)} for t in TEMPLATES}
    assert all(len(u) >= 3 for u in users.values()), users


def test_default_sizes():
    # (generation speed is a benchmark's business, not a test's: a loaded machine fails timed asserts)
    tasks = CodeDomain(seed=3).tasks("train")
    assert len(tasks) == 5000
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
    assert {t.template_id for t in domain.tasks("train")} == templates and {
        t.template_id for t in test_split
    } <= templates
    assert {t.group_id for t in train} == {p.id for p in PROJECTS if not p.test_only}


def test_task_shape(train, test_split):
    for t in train + test_split:
        assert len(t.prompt) <= 230 and "\ndef f(" in t.prompt and " == " in t.prompt
        assert t.prompt.split("\n")[0] == f"project: {next(p for p in PROJECTS if p.id == t.group_id).name}"
        lines = t.reference.rstrip("\n").split("\n")
        assert lines[0].startswith("def f(") and 2 <= len(lines) <= 4
        assert all(line.startswith("    ") for line in lines[1:])
        assert 5 <= len(t.payload["tests"]) <= 10 and t.max_turns == 2
        project = next(p for p in PROJECTS if p.id == t.group_id)
        assert t.payload["conventions"] and set(t.payload["conventions"]) <= set(project.conventions)
        assert project.test_only == t.payload["test_only_project"] and (t.split == "test" or not project.test_only)


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
    assert not result.done and ep.reward() == 0.0  # a second attempt follows, with the failing test in view
    fb = ep.feedback()
    assert result.observation == fb
    assert fb.startswith("failed test") and "f(" in fb and "returned 12345, expected" in fb
    first_input = repr(task.payload["tests"][0][0][0])
    assert first_input in fb
    assert ep.info()["total"] == len(task.payload["tests"]) and fb.startswith(ep.info()["reason"])


def test_a_failing_test_names_the_project_rule_it_checks(domain, train):
    """Each hidden test records the conventions it checks; the feedback on a failure names them,
    as descriptive test names do; a test that checks none adds nothing."""
    from tasks.code.families import render_reference

    named = plain = 0
    for task in train[:60]:
        rules = task.payload["test_rules"]
        assert len(rules) == len(task.payload["tests"]) and all(
            set(r) <= set(task.payload["conventions"]) for r in rules
        )
        assert any(rules)  # every convention matters, so some test checks one
        naive = render_reference(next(t for t in TEMPLATES if t.name == task.template_id), task.payload["params"], ())
        ep = domain.reset(task)
        obs = ep.step(naive).observation
        k = int(re.match(r"failed test (\d+):", obs).group(1)) - 1
        if rules[k]:
            named += 1
            assert obs.endswith("(project rule: " + "; ".join(CONVENTIONS[c].doc for c in rules[k]) + ")")
        else:
            plain += 1
            assert "project rule" not in obs
        assert ep.feedback() == obs
    assert named == 60 and plain == 0  # the task line's program fails only where a rule is checked


def test_a_second_attempt_after_a_failing_test(domain, train):
    task = train[0]
    fixed = domain.reset(task)
    fixed.step("def f(x):\n    return 12345\n")
    out = fixed.step(task.reference)
    assert out.done and fixed.reward() == 1.0 and len(fixed.turns) == 2 and fixed.feedback() == ""
    twice = domain.reset(task)
    twice.step("def f(x):\n    return 1\n")
    out = twice.step("def f(x):\n    return 2\n")
    assert out.done and twice.reward() == 0.0 and "returned 2" in twice.feedback()
    assert twice.step(task.reference).observation is None and twice.reward() == 0.0  # no third attempt
    single = CodeDomain(seed=0, attempts=1)
    one = single.reset(single.tasks("train", 1)[0])
    assert one.step("def f(x):\n    return 12345\n").done and one.task.max_turns == 1
    with pytest.raises(ValueError, match="attempts"):
        CodeDomain(seed=0, attempts=0)


def test_imperfect_demonstrator_ignores_conventions_until_a_test_fails(domain, train):
    import random

    for task in train[:20]:
        naive = domain.imperfect_trajectory(task, random.Random(0), recovery=0.0)
        assert naive.reward() == 0.0 and len(naive.turns) == 2  # every task's convention matters
        assert naive.turns[0].action == naive.turns[1].action != task.reference
        assert naive.turns[0].observation.startswith("failed test")
        fixed = domain.imperfect_trajectory(task, random.Random(0), recovery=1.0)
        assert fixed.reward() == 1.0 and [t.action for t in fixed.turns] == [naive.turns[0].action, task.reference]
    rates = [domain.imperfect_trajectory(t, random.Random(i), 0.35).reward() for i, t in enumerate(train[:200])]
    assert 0.2 < sum(rates) / len(rates) < 0.5


def test_fences_are_stripped(domain, train):
    task = train[1]
    ep = domain.reset(task)
    ep.step(f"```python\n{task.reference}```")
    assert ep.reward() == 1.0
    assert extract_program("```\nx = 1\n```") == "x = 1\n"
    assert extract_program("def f(x): pass") == "def f(x): pass"


# A tiny convention-free variant of a reference, per convention.
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


def drop_convention(program: str, convention: str) -> str:
    if convention in _DROP_LINE:
        out, n = re.subn(_DROP_LINE[convention], "", program)
    else:
        out, n = re.subn(r"return " + _UNWRAP[convention] + r"\n", r"return \1\n", program)
    assert n == 1, (convention, program)
    return out


def convention_free(task) -> str:
    program = task.reference
    for convention in task.payload["conventions"]:
        program = drop_convention(program, convention)
    return program


def test_conventions_matter(domain, train, test_split):
    assert set(_DROP_LINE) | set(_UNWRAP) == set(CONVENTIONS)
    tasks = train[:200] + test_split[:100]
    episodes = run_programs(domain, tasks, [convention_free(t) for t in tasks])
    assert all(ep.reward() == 0.0 for ep in episodes), [ep.task.reference for ep in episodes if ep.reward()][:3]
    assert {c for ep in episodes for c in ep.task.payload["conventions"]} == set(CONVENTIONS)


def test_each_of_two_conventions_matters(domain):
    """Where a project's two conventions both act, knowing only one of them fails."""
    tasks = [t for t in domain.tasks("train") + domain.tasks("test", 1000) if len(t.payload["conventions"]) == 2][:60]
    assert len(tasks) >= 40
    for k in range(2):
        programs = [drop_convention(t.reference, t.payload["conventions"][k]) for t in tasks]
        episodes = run_programs(domain, tasks, programs)
        assert all(ep.reward() == 0.0 for ep in episodes), [ep.task.reference for ep in episodes if ep.reward()][:3]


def test_convention_is_not_a_function_of_the_template(train, domain):
    """The same template -- even the same template and constants -- appears in
    different projects with different conventions and different references."""
    tasks = domain.tasks("train")
    convs_of, refs_of = defaultdict(set), defaultdict(set)
    for t in tasks:
        convs_of[t.template_id].add(t.payload["conventions"])
        refs_of[(t.template_id, tuple(sorted(t.payload["params"].items())))].add(t.reference)
    assert all(len(c) >= 2 for c in convs_of.values()), convs_of
    assert sum(len(r) >= 2 for r in refs_of.values()) >= 0.7 * len(refs_of)
    # and a project's convention is not a function of the template either: per
    # template, the most common convention set covers well under half its tasks
    count = defaultdict(lambda: defaultdict(int))
    for t in tasks:
        count[t.template_id][t.payload["conventions"]] += 1
    top = sum(max(c.values()) for c in count.values()) / len(tasks)
    assert top < 0.5, top


def test_every_project_needs_its_convention(domain, train, test_split):
    """A convention-free program fails (almost) every task of every project."""
    tasks = domain.tasks("train", 600) + test_split
    episodes = run_programs(domain, tasks, [convention_free(t) for t in tasks])
    by_project = defaultdict(list)
    for ep in episodes:
        by_project[ep.task.group_id].append(ep.reward())
    assert set(by_project) == {p.id for p in PROJECTS}
    for project, rewards in by_project.items():
        assert len(rewards) >= 4 and sum(rewards) / len(rewards) <= 0.1, (project, rewards)


def test_test_split_has_seen_and_unseen_projects(domain, test_split):
    train_projects = {t.group_id for t in domain.tasks("train")}
    test_only = {p.id for p in PROJECTS if p.test_only}
    assert not train_projects & test_only
    unseen = [t for t in test_split if t.group_id in test_only]
    assert 0.05 <= len(unseen) / len(test_split) <= 0.15  # every 10th test task
    assert {t.group_id for t in unseen} == test_only
    assert {t.group_id for t in test_split if t.group_id not in test_only} == train_projects
    # unseen tasks on seen projects: no (template, constants, project) of a templated test task is in train
    seen_keys = {(t.group_id, t.template_id, tuple(sorted(t.payload["params"].items()))) for t in domain.tasks("train")}
    templated = [t for t in test_split if t.payload["params"] and t.group_id in train_projects]
    assert templated and not any(
        (t.group_id, t.template_id, tuple(sorted(t.payload["params"].items()))) in seen_keys for t in templated
    )


def test_visible_examples_hide_the_convention(domain, train):
    """The convention-free program agrees with every visible example."""
    for task in train[:200]:
        namespace: dict = {}
        exec(convention_free(task), namespace)
        for line in task.prompt.split("\n")[3:]:
            call, expected = line.split(" == ")
            assert eval(call, {"f": namespace["f"]}) == eval(expected), (task.prompt, task.reference)


def test_step_batch_matches_sequential_step(domain, train):
    tasks = train[:12]
    programs = [
        [t.reference, convention_free(t), "oops(", "def f(x):\n    while True: pass\n"][k % 4]
        for k, t in enumerate(tasks)
    ]
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


def test_test_fraction_reward_is_the_share_of_hidden_tests_passed():
    import random

    dense = CodeDomain(seed=0, attempts=1, reward="test_fraction")
    assert dense.version == f"{CodeDomain.version}+test_fraction" and CodeDomain(seed=0).version == CodeDomain.version
    task = dense.tasks("train", 1)[0]
    naive = dense.reset(task)
    naive.step("def f(*args):\n    return 12345\n")
    info = naive.info()
    assert 0 <= naive.reward() == info["passed"] / info["total"] < 1
    partial = [dense.reset(t) for t in dense.tasks("train", 30)]
    rewards = []
    for ep, t in zip(partial, dense.tasks("train", 30)):
        ep.step(dense.imperfect_trajectory(t, random.Random(0), recovery=0.0).turns[0].action)
        rewards.append(ep.reward())
        assert ep.reward() == ep.info()["passed"] / ep.info()["total"]
    assert any(0 < r < 1 for r in rewards)  # convention-blind programs pass some tests, not all
    solved = dense.reset(task)
    solved.step(task.reference)
    assert solved.reward() == 1.0
    with pytest.raises(ValueError, match="reward must be one of"):
        CodeDomain(seed=0, reward="partial")
    dense.close()
