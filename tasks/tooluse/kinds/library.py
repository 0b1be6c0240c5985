"""Library: books that are in, or out to a member until a due day.

Hidden rules a variant may draw: titles written hyphenated or noun first;
member names in lower case or by surname only; some of return / lend / renew
need the book checked with ``inspect(id)`` first.
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
    id_prefixes = ("bk", "b", "book")
    ops = {
        "search": (Param("title", "label"),),
        "status": (_ID,),
        "lend": (_ID, Param("who", "person")),
        "back": (_ID,),
        "inspect": (_ID,),
        "renew": (_ID,),
    }
    synonyms = {
        "search": ("search", "find", "title", "lookup", "book_id", "seek"),
        "status": ("status", "state", "where", "info", "is_out", "loc"),
        "lend": ("lend", "loan", "issue", "give", "check_out", "out"),
        "back": ("return", "take_back", "back", "check_in", "receive", "ret"),
        "inspect": ("inspect", "check", "examine", "vet", "scan", "review"),
        "renew": ("renew", "extend", "prolong", "more", "bump", "push"),
    }

    def draw_rules(self, rng: random.Random) -> dict:
        return {
            "label_form": rng.choice(["plain", "plain", "hyphen", "rev"]),
            "person_form": rng.choice(["plain", "plain", "lower", "last"]),
            "inspect_ops": tuple(sorted(rng.sample(["back", "lend", "renew"], rng.randint(1, 2)))),
        }

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
        return {"ents": ents, "people": people}

    def apply(self, st: dict, variant, op: str, args: tuple) -> str:
        ents = st["ents"]
        if op == "search":
            found = [n for n, e in ents.items() if e["label"] == args[0]]
            if not found:
                raise ToolError(f"no book {args[0]}")
            return variant.fmt_id(found[0])
        book = ents[args[0]]
        if op in variant.rules["inspect_ops"] and not book["ok"]:
            raise RuleError(("inspect", (args[0],)))
        if op == "status":
            return f"out till day {book['due']}" if book["holder"] else "in"
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
    return TaskDraft(f"Take back {lab}.", [("search", (lab,)), ("back", (b,))], [(b, "holder")])


def _swap(rng: random.Random, st: dict, split: str) -> TaskDraft:
    a = pick(rng, st["ents"], lambda e: e["holder"] is not None)
    b = pick(rng, st["ents"], lambda e: e["holder"] is None)
    la, lb, who = st["ents"][a]["label"], st["ents"][b]["label"], rng.choice(st["people"])
    intent = [("search", (la,)), ("back", (a,)), ("search", (lb,)), ("lend", (b, who))]
    return TaskDraft(f"Take back {la} and lend {lb} to {who}.", intent, [(a, "holder"), (b, "holder")])


def _renew_or_lend(rng: random.Random, st: dict, split: str) -> TaskDraft:
    b = pick(rng, st["ents"])
    book, who = st["ents"][b], rng.choice(st["people"])
    act = ("renew", (b,)) if book["holder"] else ("lend", (b, who))
    check = (b, "due") if book["holder"] else (b, "holder")
    intent = [("search", (book["label"],)), ("status", (b,)), act]
    return TaskDraft(f"If {book['label']} is out, renew it; else lend it to {who}.", intent, [check])


Library.templates = (
    ("library/lend", _lend),
    ("library/return", _return),
    ("library/swap", _swap),
    ("library/renew_or_lend", _renew_or_lend),
)

LIBRARY = Library()
