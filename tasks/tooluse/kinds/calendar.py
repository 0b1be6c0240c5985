"""Calendar: events with a title and a day (1-28).

Tools in role order: find, when, book, move, cancel, confirm.

Hidden rules: moving and/or cancelling an event needs ``confirm(id)`` first
(``confirm_ops``); new bookings and/or moved events must be confirmed with
``confirm(id)`` before ``done`` (``after_ops``).  Every variant's rules touch
four or five of the five templates; about half of the variants have both
kinds of rule.
"""

from __future__ import annotations

import random

from .. import names
from ..spec import Kind, Param, RuleError, Step, TaskDraft, ToolError, pick, unique

_ID, _DAY = Param("id", "id"), Param("day", "int")
DAYS = range(1, 29)


class Calendar(Kind):
    name = "calendar"
    entity = "event"
    gone = "cancelled"
    id_prefixes = ("e",)
    ops = {
        "find": (Param("title", "label"),),
        "when": (_ID,),
        "book": (Param("title", "label"), _DAY),
        "move": (_ID, _DAY),
        "cancel": (_ID,),
        "confirm": (_ID,),
    }
    synonyms = {
        "find": ("find", "event", "lookup", "ev_id", "which", "get_ev"),
        "when": ("when", "day_of", "date", "day", "sched"),
        "book": ("book", "add", "new", "create", "plan", "make"),
        "move": ("move", "shift", "redate", "slide", "push"),
        "cancel": ("cancel", "drop", "remove", "kill", "delete", "scrap"),
        "confirm": ("confirm", "ok", "lock", "seal", "fix", "commit"),
    }
    #: (confirm_ops, after_ops) with one rule, and with two
    _ONE = ((("cancel", "move"), ()), ((), ("book", "move")))
    _TWO = (
        (("cancel", "move"), ("book",)),
        (("cancel",), ("book", "move")),
        (("move",), ("book",)),
        (("cancel",), ("move",)),
    )

    def draw_rules(self, rng: random.Random) -> dict:
        guarded, after = rng.choice(self._TWO if rng.random() < 0.5 else self._ONE)
        return {"confirm_ops": guarded, "after_ops": after}

    def rule_names(self, rules: dict) -> list[str]:
        out = (
            [f"{'/'.join(rules['confirm_ops'])} need{'s' if len(rules['confirm_ops']) == 1 else ''} confirm first"]
            if rules["confirm_ops"]
            else []
        )
        return out + (
            [f"{'/'.join(rules['after_ops'])} need{'s' if len(rules['after_ops']) == 1 else ''} confirm before done"]
            if rules["after_ops"]
            else []
        )

    def make_state(self, rng: random.Random, split: str) -> dict:
        n = rng.randint(4, 6)
        labels = unique(rng, lambda: names.label(rng, split, self.name), n)
        nums = rng.sample(range(10, 90), n)
        ents = {
            num: {"label": lab, "day": rng.randint(1, 20), "ok": False, "dirty": False, "need": False, "active": True}
            for num, lab in zip(nums, labels)
        }
        return {"ents": ents, "people": ()}

    def apply(self, st: dict, variant, op: str, args: tuple) -> str:
        ents = st["ents"]
        if op == "find":
            found = [n for n, e in ents.items() if e["active"] and e["label"] == args[0]]
            if not found:
                raise ToolError(f"no event {args[0][:16]}")
            return variant.fmt_id(found[0])
        rules = variant.rules
        if op == "book":
            num = self._book(ents, *args)
            ents[num]["dirty"] = ents[num]["need"] = "book" in rules["after_ops"]
            return variant.fmt_id(num)
        event = ents[args[0]]
        if op in rules["confirm_ops"] and not event["ok"]:
            raise RuleError(("confirm", (args[0],)))
        if op == "when":
            return f"day {event['day']}"
        if op == "confirm":
            event["ok"], event["dirty"] = True, False
        elif op == "move":
            event["day"] = _day(args[1])
            if "move" in rules["after_ops"]:
                event["dirty"] = event["need"] = True
        elif op == "cancel":
            event["active"] = False
        return "ok"

    def _book(self, ents: dict, title: str, day: int) -> int:
        if any(e["active"] and e["label"] == title for e in ents.values()):
            raise ToolError(f"{title[:16]} is booked")
        num = max(ents) + 1
        ents[num] = {"label": title, "day": _day(day), "ok": False, "dirty": False, "need": False, "active": True}
        return num

    def pending(self, st: dict, rules: dict) -> Step | None:
        waiting = [n for n, e in sorted(st["ents"].items()) if e["active"] and e["dirty"]]
        return ("confirm", (waiting[0],)) if waiting else None

    def rule_checks(self, before: dict, after: dict, rules: dict) -> list[tuple[int, str]]:
        return [(n, "ok") for n, e in sorted(after["ents"].items()) if e["need"] and e["active"]]


def _day(day: int) -> int:
    if day not in DAYS:
        raise ToolError("days are 1 to 28")
    return day


# --------------------------------------------------------------------------- templates
def _new_title(rng: random.Random, st: dict, split: str) -> str:
    taken = {e["label"] for e in st["ents"].values()}
    return next(t for t in iter(lambda: names.label(rng, split, "calendar"), None) if t not in taken)


def _book(rng: random.Random, st: dict, split: str) -> TaskDraft:
    title, day = _new_title(rng, st, split), rng.choice(DAYS)
    new = max(st["ents"]) + 1
    return TaskDraft(f"Book {title} on day {day}.", [("book", (title, day))], [(new, "label"), (new, "day")])


def _reschedule(rng: random.Random, st: dict, split: str) -> TaskDraft:
    e = pick(rng, st["ents"])
    event = st["ents"][e]
    day = rng.choice([d for d in DAYS if d != event["day"]])
    return TaskDraft(
        f"Move {event['label']} to day {day}.", [("find", (event["label"],)), ("move", (e, day))], [(e, "day")]
    )


def _cancel(rng: random.Random, st: dict, split: str) -> TaskDraft:
    e = pick(rng, st["ents"])
    lab = st["ents"][e]["label"]
    return TaskDraft(f"Cancel {lab}.", [("find", (lab,)), ("cancel", (e,))], [(e, "active")])


def _postpone(rng: random.Random, st: dict, split: str) -> TaskDraft:
    e = pick(rng, st["ents"])
    event = st["ents"][e]
    k = rng.randint(2, 7)
    intent = [("find", (event["label"],)), ("when", (e,)), ("move", (e, event["day"] + k))]
    return TaskDraft(f"Push {event['label']} back by {k} days.", intent, [(e, "day")])


def _replace(rng: random.Random, st: dict, split: str) -> TaskDraft:
    e = pick(rng, st["ents"])
    event, title = st["ents"][e], _new_title(rng, st, split)
    new = max(st["ents"]) + 1
    intent = [("find", (event["label"],)), ("when", (e,)), ("cancel", (e,)), ("book", (title, event["day"]))]
    checks = [(e, "active"), (new, "label"), (new, "day")]
    return TaskDraft(f"Cancel {event['label']}, book {title} on its day.", intent, checks)


Calendar.templates = (
    ("calendar/book", _book),
    ("calendar/reschedule", _reschedule),
    ("calendar/cancel", _cancel),
    ("calendar/postpone", _postpone),
    ("calendar/replace", _replace),
)

CALENDAR = Calendar()
