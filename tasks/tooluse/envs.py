"""A live tool environment: call strings in, short observations out.

:class:`Env` parses an agent's call with :mod:`tasks.tooluse.calls`, maps the
variant's tool name and argument order back to a canonical step, converts the
arguments (id format, unit; names are taken verbatim) and lets the kind apply it to a copy of
the state, committed only on success.  Every failure becomes an observation
starting with ``error:``.  :func:`simulate` runs the expert's plan from the
intent of a template, inserting the steps the hidden rules demand.
"""

from __future__ import annotations

import re
from typing import Any

from . import names
from .calls import CallError, parse_call
from .spec import Param, RuleError, Step, ToolError, copy_state
from .variants import Variant

__all__ = ["MAX_OBS", "Env", "simulate"]

MAX_OBS = 60
_INT = re.compile(r"[+-]?\d{1,9}")


def _clip(text: str) -> str:
    return text if len(text) <= MAX_OBS else text[: MAX_OBS - 3] + "..."


class Env:
    """One variant's tools acting on one state."""

    def __init__(self, variant: Variant, state: dict):
        self.variant = variant
        self.kind = variant.kind
        self.state = state
        self.executed: list[Step] = []  # canonical steps that succeeded, in order
        self.current_tool = ""  # tool name of the call being handled (for rule messages)

    # ------------------------------------------------------------------ agent side
    def call(self, action: str) -> str:
        """Observation for one call string; never raises."""
        try:
            return _clip(self.execute(self.parse(action)))
        except RuleError as e:
            return _clip(self.rule_message(self.current_tool, e))
        except (CallError, ToolError, names.NameError_) as e:
            return _clip(f"error: {e}")

    def finish(self) -> str | None:
        """Error observation if the rules still demand a step before ``done``."""
        fix = self.kind.pending(self.state, self.variant.rules)
        return None if fix is None else _clip(f"error: done needs {self.variant.render(fix)} first")

    def rule_message(self, tool: str, err: RuleError) -> str:
        """``error: needs ok(A17) first`` or ``error: over 2000 needs ok(A17) first``."""
        over = "" if not err.over else f" over {err.over * self.variant.unit}"
        return f"error:{over} needs {self.variant.render(err.fix)} first"

    def parse(self, action: str) -> Step:
        tool, raw = parse_call(action)
        op = self.variant.op_of(tool)
        if op is None:
            raise ToolError(f"unknown tool {tool[:16]}")
        self.current_tool = tool
        params = self.kind.ops[op]
        if len(raw) != len(params):
            raise ToolError(f"use {self.variant.signature(op)}")
        args: list[Any] = [None] * len(params)
        for shown, canon in enumerate(self.variant.orders[op]):
            args[canon] = self.convert(params[canon], raw[shown])
        return op, tuple(args)

    # ------------------------------------------------------------------ conversion
    def convert(self, param: Param, raw: str) -> Any:
        if param.type == "id":
            return self._entity(raw)
        if param.type in ("int", "amt"):
            return self._number(param, raw)
        if param.type == "person":
            return names.parse_person(raw, self.kind.people(self.state))
        return names.parse_label(raw)

    def _entity(self, raw: str) -> int:
        num = self.variant.parse_id(raw)
        if num is None:
            raise ToolError(f"ids look like {self.variant.fmt_id(42)}")
        ent = self.state["ents"].get(num)
        if ent is None:
            raise ToolError(f"no {self.kind.entity} {raw[:8]}")
        if not ent["active"]:
            raise ToolError(f"{raw[:8]} is {self.kind.gone}")
        return num

    def _number(self, param: Param, raw: str) -> int:
        if not _INT.fullmatch(raw):
            raise ToolError(f"{param.name} must be a number")
        value = int(raw)
        if param.type == "int":
            return value
        if value <= 0:
            raise ToolError(f"{param.name} must be positive")
        unit = self.variant.unit
        if value % unit:
            raise ToolError(f"amounts are in cents: {value} is {value * unit}")
        return value // unit

    # ------------------------------------------------------------------ canonical side
    def execute(self, step: Step) -> str:
        """Apply a canonical step; the state changes only if it succeeds."""
        self.current_tool = self.variant.tools[step[0]]
        work = copy_state(self.state)
        obs = self.kind.apply(work, self.variant, *step)
        self.state = work
        self.executed.append(step)
        return obs


def simulate(variant: Variant, state: dict, intent: list[Step]) -> tuple[list[Step], dict]:
    """The expert's full plan for ``intent`` (rule steps included) and the final state."""
    env = Env(variant, copy_state(state))
    plan: list[Step] = []
    for step in intent:
        for _ in range(4):
            try:
                env.execute(step)
            except RuleError as e:
                env.execute(e.fix)
                plan.append(e.fix)
                continue
            plan.append(step)
            break
        else:
            raise RuntimeError(f"rules keep blocking {step}")
    for _ in range(4):
        fix = variant.kind.pending(env.state, variant.rules)
        if fix is None:
            return plan, env.state
        env.execute(fix)
        plan.append(fix)
    raise RuntimeError("pending steps never settle")
