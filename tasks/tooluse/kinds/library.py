"""Library: books that are in, or out to a member until a due day.

Tools in role order: search, status, lend, back, renew, inspect, card.

Hidden rules: two or three of return / lend / renew need the book checked
with ``inspect(id)`` first (``inspect_ops``; touches most tasks); about half
of the variants also demand that a member hold a card, ``card(who)``,
before a book is lent to them.
"""

from __future__ import annotations

import random

from .. import names
from ..spec import Kind, Param, RuleError, TaskDraft, ToolError, pick, unique

_ID = Param("id", "id")
LOAN_DAYS, RENEW_DAYS = 14, 7


class Library(Kind):
    name = "library"
    entity = "book"
    gone = "gone"
    id_prefixes = ("b",)
    ops = {
        "search": (Param("title", "label"),),
        "status": (_ID,),
        "lend": (_ID, Param("who", "person")),
        "back": (_ID,),
        "renew": (_ID,),
        "inspect": (_ID,),
        "card": (Param("who", "person"),),
    }
    synonyms = {
        "search": ("search", "find", "title", "lookup", "seek", "get"),
        "status": ("status", "state", "where", "info", "is_out", "loc"),
        "lend": ("lend", "loan", "issue", "give", "out"),
        "back": ("return", "back", "ret", "recv", "take"),
        "renew": ("renew", "extend", "more", "bump", "keep"),
        "inspect": ("check", "vet", "scan", "audit", "review"),
        "card": ("card", "enrol", "member", "join", "admit", "pass"),
    }
    _INSPECT = (("back", "lend", "renew"), ("back", "lend"), ("lend", "renew"), ("back", "renew"))

    def draw_rules(self, rng: random.Random) -> dict:
        return {"inspect_ops": rng.choice(self._INSPECT), "card": rng.random() < 0.5}

    def rule_names(self, rules: dict) -> list[str]:
        return [f"{'/'.join(rules['inspect_ops'])} need{'s' if len(rules['inspect_ops']) == 1 else ''} inspect"] + (
            ["lend needs card(who)"] if rules["card"] else []
        )

    def make_state(self, rng: random.Random, split: str) -> dict:
        n = rng.randint(4, 6)
        labels = unique(rng, lambda: names.label(rng, split, self.name), n)
        people = tuple(unique(rng, lambda: names.person(rng, split), rng.randint(3, 4), key=lambda s: s.split()[-1]))
        nums = rng.sample(range(10, 90), n)
        out = [True, False] + [rng.random() < 0.5 for _ in range(n - 2)]
        ents = {}
        for num, lab, is_out in zip(nums, labels, out):
            holder = rng.choice(people) if is_out else None
            due = rng.randint(5, 20) if is_out else None
            ents[num] = {"label": lab, "holder": holder, "due": due, "ok": False, "active": True}
        return {"ents": ents, "people": people, "cards": ()}

    def apply(self, st: dict, variant, op: str, args: tuple) -> str:
        ents = st["ents"]
        if op == "search":
            found = [n for n, e in ents.items() if e["label"] == args[0]]
            if not found:
                raise ToolError(f"no book {args[0][:16]}")
            return variant.fmt_id(found[0])
        if op == "card":
            st["cards"] = tuple(sorted(set(st["cards"]) | {args[0]}))
            return "ok"
        book = ents[args[0]]
        if op in variant.rules["inspect_ops"] and not book["ok"]:
            raise RuleError(("inspect", (args[0],)))
        if op == "lend" and variant.rules["card"] and args[1] not in st["cards"]:
            raise RuleError(("card", (args[1],)))
        if op == "status":
            return f"out, due day {book['due']}" if book["holder"] else "in"
        if op == "inspect":
            book["ok"] = True
        elif op == "lend":
            if book["holder"]:
                raise ToolError(f"{variant.fmt_id(args[0])} is out")
            book["holder"], book["due"] = args[1], LOAN_DAYS
        elif not book["holder"]:
            raise ToolError(f"{variant.fmt_id(args[0])} is not out")
        elif op == "back":
            book["holder"], book["due"] = None, None
        elif op == "renew":
            book["due"] += RENEW_DAYS
        return "ok"


# --------------------------------------------------------------------------- templates
def _lend(rng: random.Random, st: dict, split: str) -> TaskDraft:
    b = pick(rng, st["ents"], lambda e: e["holder"] is None)
    lab, who = st["ents"][b]["label"], rng.choice(st["people"])
    return TaskDraft(f"Lend {lab} to {who}.", [("search", (lab,)), ("lend", (b, who))], [(b, "holder")])


def _return(rng: random.Random, st: dict, split: str) -> TaskDraft:
    b = pick(rng, st["ents"], lambda e: e["holder"] is not None)
    lab = st["ents"][b]["label"]
    return TaskDraft(f"Return {lab}.", [("search", (lab,)), ("back", (b,))], [(b, "holder")])


def _swap(rng: random.Random, st: dict, split: str) -> TaskDraft:
    a = pick(rng, st["ents"], lambda e: e["holder"] is not None)
    b = pick(rng, st["ents"], lambda e: e["holder"] is None)
    la, lb, who = st["ents"][a]["label"], st["ents"][b]["label"], rng.choice(st["people"])
    intent = [("search", (la,)), ("back", (a,)), ("search", (lb,)), ("lend", (b, who))]
    return TaskDraft(f"Return {la}, lend {lb} to {who}.", intent, [(a, "holder"), (b, "holder")])


def _renew(rng: random.Random, st: dict, split: str) -> TaskDraft:
    b = pick(rng, st["ents"], lambda e: e["holder"] is not None)
    lab = st["ents"][b]["label"]
    return TaskDraft(f"Renew {lab}.", [("search", (lab,)), ("renew", (b,))], [(b, "due")])


def _renew_or_lend(rng: random.Random, st: dict, split: str) -> TaskDraft:
    b = pick(rng, st["ents"])
    book, who = st["ents"][b], rng.choice(st["people"])
    act = ("renew", (b,)) if book["holder"] else ("lend", (b, who))
    check = (b, "due") if book["holder"] else (b, "holder")
    intent = [("search", (book["label"],)), ("status", (b,)), act]
    return TaskDraft(f"Renew {book['label']} if out, else lend to {who}.", intent, [check])


Library.templates = (
    ("library/lend", _lend),
    ("library/return", _return),
    ("library/swap", _swap),
    ("library/renew", _renew),
    ("library/renew_or_lend", _renew_or_lend),
)

LIBRARY = Library()
