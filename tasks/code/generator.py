"""Deterministic generation of code tasks from the grammar in ``families.py``.

A task is (project, template, constants).  For one such choice the generator

* applies the project's conventions that matter for the template
  (:func:`applied_conventions`) to get the reference program, and compares it
  with its *variants*: the convention-free program and, for two conventions,
  the program with only one of them;
* runs them in-process (all are our own trusted code) to pick 1-2 *visible*
  examples on which they all agree, so the prompt does not give the
  conventions away;
* picks 6-8 *hidden* tests from edge cases and wide random inputs, such that
  every variant gets at least one wrong, so each convention matters, and
  records which conventions each test checks (``test_rules``: the test's name,
  shown when the test fails).

Splits: train tasks come from the train projects; test tasks are 4/5 unseen
tasks on train projects and 1/5 tasks on test-only projects.  On train
projects, templates with constants reserve ~20% of their constant
combinations for test (by a stable hash) and constant-free templates put a
task in test iff the hash of its prompt says so; so no test prompt can occur
in train.  The ``warmstart`` split (the stand-in for pretraining) uses fresh
projects with three-digit ids and *every* constant combination, the test
split's included: the policy may know how to write ``x * 7``; what no split
but the train split shows is a train project's convention.  The stream is
sequential from one seeded ``random.Random`` per (seed, split): projects are
dealt in shuffled rounds (so every project gets its share), each project
deals its templates in shuffled rounds, and ``tasks(split, n)`` is a prefix
of the longer stream.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import random
from collections.abc import Callable

from tasks.code.families import CONVENTIONS, PROJECTS, TEMPLATES, Project, Template, render_reference, warmstart_project

__all__ = ["generate", "split_of_prompt", "applied_conventions", "project_templates"]

_MISSING = object()  # a program raised
_EDGES = {
    "xs": ([], [0], [-5], [7, 7, 7], [0, 3, 0, -2], [4, 0, 9], [-4, 9, -4], list(range(-4, 16))),
    "s": ("", " a ", "AB ab", "  ", "Hi  there ", "abcdefgh hgfedcba " * 3),
    "n": (0, -7, -305),
}
_LETTERS = "abcdefgh"
_TEST_ONLY_EVERY = 10  # every 10th test task is on a test-only project


def _stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.sha1(text.encode()).digest()[:8], "big")


@functools.cache
def _compile(source: str) -> Callable:
    namespace: dict = {}
    exec(source, namespace)  # trusted: our own reference programs
    return namespace["f"]


def _call(fn: Callable, arg):
    try:
        return fn(arg)
    except Exception:
        return _MISSING


# --------------------------------------------------------------------------- inputs
def _visible_input(rng: random.Random, arg: str):
    """Small, tidy inputs: positive ints, lowercase words, single spaces."""
    if arg == "n":
        return rng.randint(0, 999)
    if arg == "s":
        return " ".join(_word(rng, lower=True) for _ in range(rng.randint(1, 3)))
    xs = [rng.randint(1, 12) for _ in range(rng.randint(1, 4))]
    order = rng.random()
    return sorted(xs) if order < 0.35 else sorted(xs, reverse=True) if order < 0.7 else xs


def _wide_input(rng: random.Random, arg: str):
    """Messy inputs: negatives, zeros, repeats, mixed case, extra spaces."""
    if arg == "n":
        return rng.randint(-99999, 99999)
    if arg == "s":
        words = [_word(rng, lower=rng.random() < 0.4) for _ in range(rng.randint(0, 5))]
        if words and rng.random() < 0.4:
            words.insert(rng.randrange(len(words) + 1), rng.choice(words))
        pad = " " * rng.randint(0, 2)
        return pad + (" " * rng.randint(1, 2)).join(words) + pad[: rng.randint(0, len(pad))]
    xs = [rng.randint(-12, 25) for _ in range(rng.randint(0, 8))]
    for _ in range(rng.randint(0, 2)):
        if xs:
            xs.insert(rng.randrange(len(xs) + 1), rng.choice(xs + [0]))
    return xs


def _word(rng: random.Random, lower: bool) -> str:
    word = "".join(rng.choice(_LETTERS) for _ in range(rng.randint(1, 5)))
    return word if lower else "".join(c.upper() if rng.random() < 0.5 else c for c in word)


@functools.cache
def _probes(arg: str) -> tuple:
    """Fixed inputs used to decide whether a convention matters (pure, so caching is safe)."""
    rng = random.Random(f"code-v2:probes:{arg}")
    return tuple(_EDGES[arg]) + tuple(_wide_input(rng, arg) for _ in range(60))


# --------------------------------------------------------------------------- conventions
def _key(params: dict) -> tuple:
    return tuple(sorted(params.items()))


def _variant_sets(convs: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The convention sets a solver could wrongly use: every proper subset of ``convs``."""
    return [subset for r in range(len(convs)) for subset in itertools.combinations(convs, r)]


@functools.cache
def _programs(template: Template, key: tuple, convs: tuple[str, ...]) -> tuple[str, Callable, tuple]:
    params = dict(key)
    reference = render_reference(template, params, convs)
    variants = tuple(_compile(render_reference(template, params, v)) for v in _variant_sets(convs))
    return reference, _compile(reference), variants


@functools.cache
def _matters(template: Template, key: tuple, convs: tuple[str, ...]) -> bool:
    """Whether every variant of the program gets some probe input wrong."""
    if not convs:
        return False
    _, ref, variants = _programs(template, key, convs)
    todo = set(range(len(variants)))
    for x in _probes(template.arg):
        y = _call(ref, x)
        if y is _MISSING:
            continue
        todo -= {i for i in todo if _call(variants[i], x) != y}
        if not todo:
            return True
    return False


def _same(template: Template, key: tuple, a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    fa, fb = _programs(template, key, a)[1], _programs(template, key, b)[1]
    return all(_call(fa, x) == _call(fb, x) for x in _probes(template.arg))


@functools.cache
def applied_conventions(template: Template, project_convs: tuple[str, ...]) -> tuple[str, ...]:
    """The project's conventions as they act on ``template``: those whose types fit
    and whose effect shows (``()`` if none does: the project never uses the
    template).  When one convention masks the other (sorting the input, then
    sorting the result), only the one that decides the result is kept."""
    fits = tuple(c for c in project_convs if CONVENTIONS[c].fits(template))
    combos = [_key(c) for c in template.combos()]
    if any(_matters(template, k, fits) for k in combos):
        return fits
    for c in fits if len(fits) > 1 else ():
        if any(_matters(template, k, (c,)) and _same(template, k, fits, (c,)) for k in combos):
            return (c,)
    return ()


@functools.cache
def project_templates(project: Project) -> tuple[Template, ...]:
    """The templates ``project`` uses: those where at least one of its conventions matters."""
    return tuple(t for t in TEMPLATES if applied_conventions(t, project.conventions))


# --------------------------------------------------------------------------- examples and tests
def _visible_examples(rng, template: Template, ref: Callable, variants: tuple) -> list[tuple]:
    examples: list[tuple] = []
    for _ in range(200):
        x = _visible_input(rng, template.arg)
        y = _call(ref, x)
        if y is _MISSING or any(x == e for e, _ in examples) or any(_call(v, x) != y for v in variants):
            continue
        examples.append((x, y))
        if len(examples) == 2 or (len(examples) == 1 and rng.random() < 0.3):
            break
    return examples


def _hidden_tests(rng, template: Template, ref: Callable, variants: tuple) -> list[tuple] | None:
    """6-8 (input, expected) pairs; 1-3 of them expose a convention, and every
    variant fails at least one.  None if some variant cannot be exposed."""
    edges = list(_EDGES[template.arg])
    rng.shuffle(edges)
    exposing, others, seen = [], [], set()
    covered: set[int] = set()
    for k in range(400):
        x = edges[k] if k < len(edges) else _wide_input(rng, template.arg)
        y = _call(ref, x)
        if y is _MISSING or repr(x) in seen:
            continue
        seen.add(repr(x))
        breaks = frozenset(i for i, v in enumerate(variants) if _call(v, x) != y)
        covered |= breaks
        (exposing if breaks else others).append((x, y, breaks))
        if k >= 30 and len(covered) == len(variants) and len(exposing) + len(others) >= 10:
            break
    if len(covered) < len(variants):
        return None
    rng.shuffle(others)
    total, n_exposing = rng.randint(6, 8), rng.randint(1, 3)
    tests, hit = [], set()
    for test in exposing:  # first cover every variant, in discovery order
        if not test[2] <= hit:
            tests.append(test)
            hit |= test[2]
    rest = [t for t in exposing if t not in tests]
    tests += rest[: max(0, n_exposing - len(tests))]
    tests += others[: total - len(tests)]
    tests += [t for t in rest if t not in tests][: total - len(tests)]
    rng.shuffle(tests)
    return [(x, y) for x, y, _ in tests]


# --------------------------------------------------------------------------- prompts and splits
def _prompt(project: Project, template: Template, params: dict, examples: list[tuple]) -> str:
    lines = [f"project: {project.shown}", template.text.format(**params), f"def f({template.arg}):"]
    lines += [f"f({x!r}) == {y!r}" for x, y in examples]
    return "\n".join(lines)


def split_of_prompt(prompt: str) -> str:
    return "test" if _stable_hash(prompt) % 5 == 0 else "train"


@functools.cache
def _combos_by_split(template: Template) -> dict[str, list[dict]]:
    combos = template.combos()
    if len(combos) < 3:
        return {"train": combos, "test": combos, "all": combos}  # split decided per prompt instead
    ranked = sorted(combos, key=lambda c: _stable_hash(f"{template.name}:{sorted(c.items())}"))
    cut = max(1, len(ranked) // 5)
    return {"test": ranked[:cut], "train": ranked[cut:], "all": combos}


def _one_task(rng: random.Random, project: Project, template: Template, split: str) -> dict | None:
    """A task dict for ``split``, or None if this draw belongs to the other split or shows no convention."""
    convs = applied_conventions(template, project.conventions)
    # test-only and warm-start projects never meet the train split, so they use every constant
    params = rng.choice(_combos_by_split(template)["all" if project.test_only or split == "warmstart" else split])
    key = _key(params)
    if not _matters(template, key, convs):
        return None
    reference, ref, variants = _programs(template, key, convs)
    examples = _visible_examples(rng, template, ref, variants)
    prompt = _prompt(project, template, params, examples)
    if split != "warmstart" and not project.test_only and not template.params and split_of_prompt(prompt) != split:
        return None
    tests = _hidden_tests(rng, template, ref, variants)
    if tests is None:
        return None
    without = {c: _compile(render_reference(template, params, tuple(d for d in convs if d != c))) for c in convs}
    return {
        "project": project,
        "template": template,
        "conventions": convs,
        "params": params,
        "prompt": prompt,
        "reference": reference,
        "tests": [((x,), y) for x, y in tests],
        # per hidden test, the conventions it checks (leaving one out fails it): the test's name
        "test_rules": [tuple(c for c in convs if _call(without[c], x) != y) for x, y in tests],
    }


#: tasks per warm-start project (one demonstration and its same-project context examples)
WARMSTART_TASKS_PER_PROJECT = 4


def _generate_warmstart(seed: int, n: int) -> list[dict]:
    """Warm-start stream: fresh projects (:func:`warmstart_project`), a few tasks each,
    over every (template, constants) pair.

    The warm start stands in for pretraining: it should know how to write
    ``x * 7`` whatever the project.  With the train split's pairs only
    (code-v2), it never saw the constants held out for the test split and
    wrote the training constants instead (measured, seed 0: greedy held-out
    reward 0.075 on seen projects even with the task's own solution in its
    context, 0.375 on test-only projects, whose tasks use every constant).
    The methods' train split still holds the test pairs out."""
    rng = random.Random(f"code-v2:{seed}:warmstart")
    out: list[dict] = []
    prompts: set[str] = set()
    g = 0
    while len(out) < n:
        project = warmstart_project(g)
        templates = list(project_templates(project))
        rng.shuffle(templates)
        got = 0
        for template in templates * 3:
            task = _one_task(rng, project, template, "warmstart")
            if task is not None and task["prompt"] not in prompts:
                prompts.add(task["prompt"])
                out.append(task)
                got += 1
                if got == WARMSTART_TASKS_PER_PROJECT or len(out) == n:
                    break
        g += 1
    return out


def generate(seed: int, split: str, n: int) -> list[dict]:
    """The first ``n`` task dicts of the deterministic ``split`` stream."""
    if split == "warmstart":
        return _generate_warmstart(seed, n)
    rng = random.Random(f"code-v2:{seed}:{split}")
    seen_projects = [p for p in PROJECTS if not p.test_only]
    new_projects = [p for p in PROJECTS if p.test_only]
    decks: dict[str, list] = {"seen": [], "new": []}
    template_decks: dict[str, list[Template]] = {}
    out: list[dict] = []
    prompts: set[str] = set()
    while len(out) < n:
        kind = "new" if split == "test" and len(out) % _TEST_ONLY_EVERY == _TEST_ONLY_EVERY - 1 else "seen"
        if not decks[kind]:
            decks[kind] = list(new_projects if kind == "new" else seen_projects)
            rng.shuffle(decks[kind])
        project = decks[kind].pop()
        for _ in range(100):  # redraw duplicates, other-split draws and draws that show no convention
            deck = template_decks.setdefault(project.id, [])
            if not deck:
                deck += project_templates(project)
                rng.shuffle(deck)
            task = _one_task(rng, project, deck.pop(), split)
            if task is not None and task["prompt"] not in prompts:
                break
        else:
            raise RuntimeError(f"project {project.id}: cannot draw a new {split} task")
        prompts.add(task["prompt"])
        out.append(task)
    return out
