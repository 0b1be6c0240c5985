"""Deterministic generation of code tasks from the grammar in ``families.py``.

For one (template, constants) choice the generator

* runs the reference and the convention-free reference in-process (both are
  our own trusted code) to pick 1-2 *visible* examples on which the two agree,
  so the prompt does not give the convention away;
* picks 6-8 *hidden* tests from edge cases and wide random inputs, at least
  one of which the convention-free program gets wrong, so the convention matters.

Splits: templates with constants reserve ~20% of their constant combinations
for test (by a stable hash); constant-free templates put a task in test iff the
hash of its prompt says so.  So no test prompt can occur in train.  The task
stream is sequential from one seeded ``random.Random`` per (seed, split), with
templates dealt in shuffled rounds, so ``tasks(split, n)`` is a prefix of the
longer stream and every template appears once per round.
"""

from __future__ import annotations

import functools
import hashlib
import random
from typing import Callable

from tasks.code.families import TEMPLATES, Template, render_reference

__all__ = ["generate", "split_of_prompt"]

_MISSING = object()  # the convention-free program raised
_EDGES = {
    "xs": ([], [0], [-5], [7, 7, 7], [0, 3, 0, -2], [4, 0, 9], [-4, 9, -4], list(range(-4, 16))),
    "s": ("", " a ", "AB ab", "  ", "Hi  there ", "abcdefgh hgfedcba " * 3),
    "n": (0, -7, -305),
}
_LETTERS = "abcdefgh"


def _stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.sha1(text.encode()).digest()[:8], "big")


@functools.lru_cache(maxsize=None)
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


# --------------------------------------------------------------------------- examples and tests
def _visible_examples(rng, template: Template, ref: Callable, plain: Callable) -> list[tuple]:
    examples: list[tuple] = []
    for _ in range(200):
        x = _visible_input(rng, template.arg)
        y = _call(ref, x)
        if y is not _MISSING and _call(plain, x) == y and all(x != e for e, _ in examples):
            examples.append((x, y))
            if len(examples) == 2 or (len(examples) == 1 and rng.random() < 0.3):
                break
    return examples


def _hidden_tests(rng, template: Template, ref: Callable, plain: Callable) -> list[tuple]:
    """6-8 (input, expected) pairs; 1-3 of them break the convention-free program."""
    edges = list(_EDGES[template.arg])
    rng.shuffle(edges)
    exposing, others, seen = [], [], set()
    for k in range(400):
        x = edges[k] if k < len(edges) else _wide_input(rng, template.arg)
        y = _call(ref, x)
        if y is _MISSING or repr(x) in seen:
            continue
        seen.add(repr(x))
        (exposing if _call(plain, x) != y else others).append((x, y))
        if k >= 40 and exposing and len(exposing) + len(others) >= 10:
            break
    if not exposing:
        raise RuntimeError(f"template {template.name}: no hidden test exposes the convention")
    rng.shuffle(others)
    total, n_exposing = rng.randint(6, 8), rng.randint(1, 3)
    tests = exposing[:n_exposing]
    tests += others[: total - len(tests)]
    tests += exposing[n_exposing : n_exposing + total - len(tests)]
    rng.shuffle(tests)
    return tests


# --------------------------------------------------------------------------- prompts and splits
def _prompt(template: Template, params: dict, examples: list[tuple]) -> str:
    lines = [template.text.format(**params), f"def f({template.arg}):"]
    lines += [f"f({x!r}) == {y!r}" for x, y in examples]
    return "\n".join(lines)


def split_of_prompt(prompt: str) -> str:
    return "test" if _stable_hash(prompt) % 5 == 0 else "train"


@functools.lru_cache(maxsize=None)
def _combos_by_split(template: Template) -> dict[str, list[dict]]:
    combos = template.combos()
    if len(combos) < 3:
        return {"train": combos, "test": combos}  # split decided per prompt instead
    ranked = sorted(combos, key=lambda c: _stable_hash(f"{template.name}:{sorted(c.items())}"))
    cut = max(1, len(ranked) // 5)
    return {"test": ranked[:cut], "train": ranked[cut:]}


def _one_task(rng: random.Random, template: Template, split: str) -> dict | None:
    """A task dict for ``split``, or None if this draw belongs to the other split."""
    params = rng.choice(_combos_by_split(template)[split])
    reference = render_reference(template, params)
    ref, plain = _compile(reference), _compile(render_reference(template, params, convention=False))
    examples = _visible_examples(rng, template, ref, plain)
    prompt = _prompt(template, params, examples)
    if not template.params and split_of_prompt(prompt) != split:
        return None
    return {
        "template": template,
        "params": params,
        "prompt": prompt,
        "reference": reference,
        "tests": [((x,), y) for x, y in _hidden_tests(rng, template, ref, plain)],
    }


def generate(seed: int, split: str, n: int) -> list[dict]:
    """The first ``n`` task dicts of the deterministic ``split`` stream."""
    rng = random.Random(f"code-v1:{seed}:{split}")
    out: list[dict] = []
    seen: set[str] = set()
    order: list[Template] = []
    while len(out) < n:
        if not order:
            order = list(TEMPLATES)
            rng.shuffle(order)
        template = order.pop()
        for _ in range(50):  # redraw duplicates and other-split draws
            task = _one_task(rng, template, split)
            if task is not None and task["prompt"] not in seen:
                break
        else:
            raise RuntimeError(f"template {template.name}: cannot draw a new {split} task")
        seen.add(task["prompt"])
        out.append(task)
    return out
