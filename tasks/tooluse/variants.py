"""Environment variants: one kind, renamed and given hidden rules.

A variant is a pure function of ``(kind, index)``: its tool names come from the
kind's synonym pools, each tool's argument order is shuffled (the signature
shows it), ids get their own short format ("A17", "a-17", "17x", "#17",
"017") and the kind draws the hidden rules (approval thresholds, cents,
required scans and confirmations).  Tools are always listed in the kind's
role order, so a tool's position tells its role while its name varies.
Indices below :data:`N_TRAIN_VARIANTS` are used by both splits; the next
:data:`N_TEST_VARIANTS` appear only in the test split.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import cache
from typing import Any

from .spec import Kind, Param, Step

__all__ = ["N_TRAIN_VARIANTS", "N_TEST_VARIANTS", "Variant", "make_variant"]

N_TRAIN_VARIANTS = 8  # per kind: few enough that a 1,600-rollout run and a 1,000-task bank see each one often
N_TEST_VARIANTS = 2

_LETTERS = "ABCDEKMPRST"
_SUFFIXES = "xyzqk"


@dataclass(frozen=True, eq=False)
class Variant:
    kind: Kind
    index: int
    tools: dict[str, str]  # canonical op -> tool name
    orders: dict[str, tuple[int, ...]]  # op -> canonical param indices in shown order
    listing: tuple[str, ...]  # ops in the order the prompt lists them (the kind's role order)
    id_style: tuple[str, int, str]  # (prefix, zero-pad width, suffix)
    rules: dict[str, Any]

    @property
    def vid(self) -> str:
        return f"{self.kind.name}-{self.index}"

    @property
    def unit(self) -> int:
        return self.rules.get("unit", 1)

    def op_of(self, tool: str) -> str | None:
        return next((op for op, t in self.tools.items() if t == tool), None)

    # ------------------------------------------------------------------ ids
    def fmt_id(self, num: int) -> str:
        pre, width, post = self.id_style
        return f"{pre}{num:0{width}d}{post}"

    def parse_id(self, raw: str) -> int | None:
        pre, _, post = self.id_style
        m = re.fullmatch(re.escape(pre) + r"(\d{1,6})" + re.escape(post), raw.strip(), re.I)
        return int(m.group(1)) if m else None

    # ------------------------------------------------------------------ rendering
    def signature(self, op: str) -> str:
        params = self.kind.ops[op]
        return f"{self.tools[op]}({','.join(params[i].name for i in self.orders[op])})"

    def tool_line(self) -> str:
        return "tools: " + " ".join(self.signature(op) for op in self.listing)

    def show_arg(self, param: Param, value: Any) -> str:
        if param.type == "id":
            return self.fmt_id(value)
        if param.type == "amt":
            return str(value * self.unit)
        return str(value)  # ints; persons and labels verbatim

    def render(self, step: Step) -> str:
        """The call string that performs canonical ``step`` in this variant."""
        op, args = step
        params = self.kind.ops[op]
        shown = [self.show_arg(params[i], args[i]) for i in self.orders[op]]
        return f"{self.tools[op]}({', '.join(shown)})"


def _id_style(rng: random.Random, kind: Kind) -> tuple[str, int, str]:
    """Ids are short (at most 4 characters): A17, a-17, 17x, #17, 017."""
    style = rng.randrange(5)
    if style == 0:
        return rng.choice(_LETTERS), 2, ""
    if style == 1:
        return rng.choice(kind.id_prefixes) + "-", 2, ""
    if style == 2:
        return "", 2, rng.choice(_SUFFIXES)
    if style == 3:
        return "#", 2, ""
    return "", 3, ""


def _tool_names(rng: random.Random, kind: Kind) -> dict[str, str]:
    used: set[str] = set()
    tools = {}
    for op in kind.ops:
        name = rng.choice([s for s in kind.synonyms[op] if s not in used])
        used.add(name)
        tools[op] = name
    return tools


@cache
def make_variant(kind: Kind, index: int) -> Variant:
    """Variant ``index`` of ``kind``; deterministic, independent of any seed."""
    rng = random.Random(f"tooluse-variant:{kind.name}:{index}")
    tools = _tool_names(rng, kind)
    orders = {op: tuple(rng.sample(range(len(ps)), len(ps))) for op, ps in kind.ops.items()}
    listing = tuple(kind.ops)
    id_style = _id_style(rng, kind)
    return Variant(kind, index, tools, orders, listing, id_style, kind.draw_rules(rng))
