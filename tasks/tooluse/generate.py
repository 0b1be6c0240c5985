"""Deterministic task generation for the tool-use domain.

Task ``i`` of a split depends only on ``(seed, split, i)``, so a split is the
prefix of an infinite stream.  A task picks a kind, a variant (test: ~20 % on
test-only variants), a fresh state with names from the split's pool and a
template; the expert's plan, the reference and the checks come from
simulating the template's intent under the variant's hidden rules.
"""

from __future__ import annotations

import random

from ..base import Task
from .envs import simulate
from .kinds import KINDS
from .variants import N_TEST_VARIANTS, N_TRAIN_VARIANTS, make_variant

__all__ = [
    "DOMAIN",
    "TEST_ONLY_FRACTION",
    "MAX_TURNS",
    "WARMSTART_VARIANT_BASE",
    "make_task",
    "task_for",
    "all_template_ids",
]

DOMAIN = "tooluse"
TEST_ONLY_FRACTION = 0.1
MAX_TURNS = 8
_KIND_NAMES = tuple(KINDS)


def all_template_ids() -> list[str]:
    return [tid for kind in KINDS.values() for tid, _ in kind.templates]


#: first variant index of the warm-start split, far above the train and test variants
WARMSTART_VARIANT_BASE = 100_000
#: tasks per warm-start variant (one demonstration and its same-variant context examples)
WARMSTART_TASKS_PER_VARIANT = 4


def _variant_index(rng: random.Random, split: str, i: int) -> int:
    if split == "warmstart":
        # a fresh variant every few tasks: the warm start cannot memorize any
        # variant's rules and must learn to read them from a context block
        return WARMSTART_VARIANT_BASE + i // WARMSTART_TASKS_PER_VARIANT
    if split == "test" and rng.random() < TEST_ONLY_FRACTION:
        return N_TRAIN_VARIANTS + rng.randrange(N_TEST_VARIANTS)
    return rng.randrange(N_TRAIN_VARIANTS)


def make_task(seed: int, split: str, i: int) -> Task:
    rng = random.Random(f"tooluse-task:{seed}:{split}:{i}")
    if split == "warmstart":  # the tasks of one warm-start variant share its kind
        kind = KINDS[random.Random(f"tooluse-warmstart-kind:{i // WARMSTART_TASKS_PER_VARIANT}").choice(_KIND_NAMES)]
    else:
        kind = KINDS[rng.choice(_KIND_NAMES)]
    variant = make_variant(kind, _variant_index(rng, split, i))
    template_id, make = rng.choice(kind.templates)
    return _build(rng, seed, split, i, variant, template_id, make)


def task_for(kind_name: str, variant_index: int, template_id: str, seed: int, split: str = "train", i: int = 0) -> Task:
    """A task of a chosen variant and template (for tests and analyses; not part of any split)."""
    kind = KINDS[kind_name]
    make = dict(kind.templates)[template_id]
    rng = random.Random(f"tooluse-task-for:{seed}:{split}:{kind_name}:{variant_index}:{template_id}:{i}")
    return _build(
        rng, seed, split, f"{kind_name}{variant_index}-{i}", make_variant(kind, variant_index), template_id, make
    )


def _build(rng: random.Random, seed: int, split: str, i, variant, template_id: str, make) -> Task:
    kind = variant.kind
    state = kind.make_state(rng, split)
    draft = make(rng, state, split)
    plan, final = simulate(variant, state, draft.intent)
    keys = draft.checks + kind.rule_checks(state, final, variant.rules)
    checks = tuple((num, attr, final["ents"][num][attr]) for num, attr in keys)
    calls = [variant.render(step) for step in plan] + ["done"]
    return Task(
        task_id=f"{DOMAIN}-{seed}-{split}-{i}",
        domain=DOMAIN,
        split=split,
        template_id=template_id,
        group_id=variant.vid,
        prompt=f"env: {variant.vid}\n{variant.tool_line()}\n{draft.instruction}",
        reference="\n".join(calls),
        max_turns=min(len(calls) + 2, MAX_TURNS),
        payload={
            "kind": kind.name,
            "variant": variant.index,
            "state": state,
            "plan": tuple(plan),
            "intent": tuple(draft.intent),
            "checks": checks,
        },
    )
