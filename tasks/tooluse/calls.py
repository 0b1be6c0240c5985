"""The one call format agents use: ``tool_name(arg1, arg2)`` or ``done``.

Arguments are bare ints, bare words ("Mara Velk", "A17") or quoted strings;
whitespace and quotes are handled leniently.  Only the first non-empty line
of an action counts.  Parsing never raises anything but :class:`CallError`,
whose message is the observation shown to the agent.
"""

from __future__ import annotations

import re

__all__ = ["CallError", "first_line", "is_done", "parse_call", "call_key"]

_CALL = re.compile(r"([A-Za-z_]\w*)\s*\((.*)\)\s*[;.]?", re.S)
_DONE = re.compile(r"done(\s*\(\s*\))?\s*[;.]?", re.I)
_QUOTES = "\"'`"


class CallError(ValueError):
    """A malformed action; the message says what is wrong."""


def first_line(action: str) -> str:
    for line in action.splitlines():
        if line.strip():
            return line.strip()
    return ""


def is_done(action: str) -> bool:
    return _DONE.fullmatch(first_line(action)) is not None


def _split_args(inner: str) -> list[str]:
    args, cur, quote = [], [], ""
    for ch in inner:
        if quote:
            if ch == quote:
                quote = ""
            cur.append(ch)
        elif ch in _QUOTES:
            quote = ch
            cur.append(ch)
        elif ch == ",":
            args.append("".join(cur))
            cur = []
        elif ch in "()":
            raise CallError("no ( ) inside arguments")
        else:
            cur.append(ch)
    if quote:
        raise CallError("unclosed quote")
    args.append("".join(cur))
    return [_unquote(a) for a in args]


def _unquote(arg: str) -> str:
    arg = arg.strip()
    if len(arg) >= 2 and arg[0] == arg[-1] and arg[0] in _QUOTES:
        return arg[1:-1].strip()
    return arg


def parse_call(action: str) -> tuple[str, list[str]]:
    """``(tool_name, raw_args)`` of one call, or CallError."""
    line = first_line(action)
    if not line:
        raise CallError("empty action")
    if line.count("(") != line.count(")"):
        raise CallError("unbalanced parentheses")
    m = _CALL.fullmatch(line)
    if m is None:
        raise CallError("expected name(args) or done")
    name, inner = m.group(1), m.group(2)
    if not inner.strip():
        return name, []
    args = _split_args(inner)
    if any(a == "" for a in args):
        raise CallError("empty argument")
    return name, args


def call_key(action: str) -> str:
    """The action with all whitespace removed (to spot repeated calls)."""
    return "".join(first_line(action).split())
