"""What an environment *kind* (bank, inventory, ...) declares, and its errors.

A kind has canonical operations with typed parameters, synonym pools for their
tool names, a state generator, hidden-rule draws, task templates and the
semantics of every operation (:meth:`Kind.apply`).  Variants
(:mod:`tasks.tooluse.variants`) rename and reorder the operations and fix the
rule parameters; :mod:`tasks.tooluse.envs` parses calls into canonical steps.
The operations are declared in *role order* (lookup, read, changes, then the
operations only hidden rules need); every variant lists its tools in that order.

State layout (plain dicts, picklable): ``{"ents": {num: {attr: value}},
"people": (names...), ...}`` (further keys hold immutable values, e.g. the
tuple of carded members); ``num`` is an entity's numeric id, shown to the agent
in the variant's id format.  A *step* is ``(op, args)`` with canonical
arguments (numeric ids, whole amounts, canonical names).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

__all__ = ["Param", "Step", "ToolError", "RuleError", "TaskDraft", "Template", "Kind", "copy_state", "pick", "unique"]

Step = tuple[str, tuple]


@dataclass(frozen=True)
class Param:
    name: str  # shown in the tool signature
    type: str  # "id" | "int" | "amt" (int in the variant's unit) | "person" | "label" (both verbatim)


class ToolError(ValueError):
    """A call that cannot be carried out; the message is the observation text."""


class RuleError(ValueError):
    """A call that breaks a hidden rule: ``fix`` is the step needed first."""

    def __init__(self, fix: Step, over: int | None = None):
        super().__init__(f"needs {fix} first")
        self.fix = fix
        self.over = over  # the amount threshold that triggered the rule, if any


class TaskDraft(NamedTuple):
    instruction: str
    intent: list[Step]  # the template's calls, before rule-required steps
    checks: list[tuple[int, str]]  # (entity num, attr) compared with the expert's final state


Template = tuple[str, Callable[[random.Random, dict, str], TaskDraft]]


class Kind:
    """Base of the environment kinds; subclasses fill in the class attributes."""

    name: ClassVar[str]
    entity: ClassVar[str]  # "account": used in error messages
    gone: ClassVar[str]  # "closed": the word for an inactive entity
    id_prefixes: ClassVar[tuple[str, ...]]
    ops: ClassVar[dict[str, tuple[Param, ...]]]
    synonyms: ClassVar[dict[str, tuple[str, ...]]]
    templates: ClassVar[tuple[Template, ...]]

    def draw_rules(self, rng: random.Random) -> dict[str, Any]:
        raise NotImplementedError

    def rule_names(self, rules: dict[str, Any]) -> list[str]:
        """The hidden rules of ``rules`` in words, one entry per rule (for tests and docs)."""
        raise NotImplementedError

    def make_state(self, rng: random.Random, split: str) -> dict:
        raise NotImplementedError

    def apply(self, st: dict, variant: Any, op: str, args: tuple) -> str:
        """Carry out ``op`` on ``st`` in place; raise ToolError / RuleError without side effects."""
        raise NotImplementedError

    def pending(self, st: dict, rules: dict) -> Step | None:
        """A step the rules still demand before ``done`` (None: nothing)."""
        return None

    def rule_checks(self, before: dict, after: dict, rules: dict) -> list[tuple[int, str]]:
        """Extra (num, attr) checks the hidden rules add (e.g. "new booking confirmed")."""
        return []

    def people(self, st: dict) -> tuple[str, ...]:
        """Person names that ``person`` arguments may denote."""
        return st["people"]


def copy_state(st: dict) -> dict:
    out = dict(st)
    out["ents"] = {k: dict(v) for k, v in st["ents"].items()}
    return out


def pick(rng: random.Random, ents: dict[int, dict], cond: Callable[[dict], bool] = lambda e: True) -> int:
    """A random active entity num satisfying ``cond``."""
    return rng.choice([n for n, e in sorted(ents.items()) if e["active"] and cond(e)])


def unique(rng: random.Random, make: Callable[[], str], n: int, key: Callable[[str], str] = str) -> list[str]:
    """``n`` values from ``make`` whose ``key`` differ."""
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        v = make()
        if key(v) not in seen:
            seen.add(key(v))
            out.append(v)
    return out
