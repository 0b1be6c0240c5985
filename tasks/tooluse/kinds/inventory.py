"""Inventory: items with a stock level and a shelf.

Tools in role order: find, count, add, remove, move, scan, log.

Hidden rules: every variant makes two or three of add / remove / move need
the item scanned with ``scan(id)`` first, or makes every changed item logged
with ``log(id)`` before ``done``; about half of the variants have both rules
(then the scan rule may cover fewer operations).
"""

from __future__ import annotations

import random

from .. import names
from ..spec import Kind, Param, RuleError, Step, TaskDraft, ToolError, pick, unique

_ID = Param("id", "id")
SHELVES = range(1, 10)
_CHANGES = ("add", "remove", "move")


class Inventory(Kind):
    name = "inventory"
    entity = "item"
    gone = "gone"
    id_prefixes = ("s",)
    ops = {
        "find": (Param("item", "label"),),
        "count": (_ID,),
        "add": (_ID, Param("n", "int")),
        "remove": (_ID, Param("n", "int")),
        "move": (_ID, Param("shelf", "int")),
        "scan": (_ID,),
        "log": (_ID,),
    }
    synonyms = {
        "find": ("find", "sku_of", "lookup", "item", "locate", "where"),
        "count": ("count", "qty", "stock", "level", "tally"),
        "add": ("add", "refill", "put", "fill", "load"),
        "remove": ("remove", "ship", "take", "pull", "pick"),
        "move": ("move", "shelve", "place", "put_on", "slot"),
        "scan": ("scan", "check", "tag", "mark", "audit"),
        "log": ("log", "save", "record", "note", "sync", "commit"),
    }

    def draw_rules(self, rng: random.Random) -> dict:
        """``scan_ops``: changes that need scan(id) first; ``log``: changed items need log(id) before done."""
        # scan sets that touch at least four of the five templates
        wide = [("add", "move", "remove"), ("add", "remove"), ("add", "move")]
        main = rng.choice(["scan", "scan", "log"])
        if main == "scan":
            scan_ops, log = rng.choice(wide), rng.random() < 0.5
        else:  # the log rule touches every template; a scan rule, if any, may be narrow
            narrow = wide + [("move", "remove"), ("add",), ("remove",), ("move",)]
            scan_ops, log = (rng.choice(narrow) if rng.random() < 0.5 else ()), True
        return {"scan_ops": tuple(sorted(scan_ops)), "log": log}

    def rule_names(self, rules: dict) -> list[str]:
        out = (
            [f"{'/'.join(rules['scan_ops'])} need{'s' if len(rules['scan_ops']) == 1 else ''} scan"]
            if rules["scan_ops"]
            else []
        )
        return out + (["changes need log before done"] if rules["log"] else [])

    def make_state(self, rng: random.Random, split: str) -> dict:
        n = rng.randint(4, 6)
        labels = unique(rng, lambda: names.label(rng, split, self.name), n)
        nums = rng.sample(range(10, 90), n)
        ents = {
            num: {
                "label": lab,
                "qty": rng.randint(2, 40),
                "shelf": rng.choice(SHELVES),
                "ok": False,
                "dirty": False,
                "logged": None,
                "active": True,
            }
            for num, lab in zip(nums, labels)
        }
        return {"ents": ents, "people": ()}

    def apply(self, st: dict, variant, op: str, args: tuple) -> str:
        ents, rules = st["ents"], variant.rules
        if op == "find":
            found = [n for n, e in ents.items() if e["active"] and e["label"] == args[0]]
            if not found:
                raise ToolError(f"no item {args[0][:16]}")
            return variant.fmt_id(found[0])
        item = ents[args[0]]
        if op in rules["scan_ops"] and not item["ok"]:
            raise RuleError(("scan", (args[0],)))
        if op == "count":
            return f"stock {item['qty']}"
        if op == "scan":
            item["ok"] = True
        elif op == "log":
            item["dirty"], item["logged"] = False, (item["qty"], item["shelf"])
        elif op == "add":
            if args[1] <= 0:
                raise ToolError("n must be positive")
            item["qty"] += args[1]
        elif op == "remove":
            if not 0 < args[1] <= item["qty"]:
                raise ToolError(f"stock is only {item['qty']}")
            item["qty"] -= args[1]
        elif op == "move":
            if args[1] not in SHELVES:
                raise ToolError("shelves are 1 to 9")
            item["shelf"] = args[1]
        if op in _CHANGES and rules["log"]:
            item["dirty"] = True
        return "ok"

    def pending(self, st: dict, rules: dict) -> Step | None:
        if not rules["log"]:
            return None
        waiting = [n for n, e in sorted(st["ents"].items()) if e["active"] and e["dirty"]]
        return ("log", (waiting[0],)) if waiting else None

    def rule_checks(self, before: dict, after: dict, rules: dict) -> list[tuple[int, str]]:
        if not rules["log"]:
            return []
        return [(n, "logged") for n, e in sorted(after["ents"].items()) if e["logged"] != before["ents"][n]["logged"]]


# --------------------------------------------------------------------------- templates
def _restock(rng: random.Random, st: dict, split: str) -> TaskDraft:
    i = pick(rng, st["ents"])
    n, lab = rng.randint(2, 30), st["ents"][i]["label"]
    return TaskDraft(f"Add {n} units of {lab}.", [("find", (lab,)), ("add", (i, n))], [(i, "qty")])


def _ship(rng: random.Random, st: dict, split: str) -> TaskDraft:
    i = pick(rng, st["ents"])
    item = st["ents"][i]
    n = rng.randint(1, item["qty"])
    return TaskDraft(f"Ship {n} of {item['label']}.", [("find", (item["label"],)), ("remove", (i, n))], [(i, "qty")])


def _relocate(rng: random.Random, st: dict, split: str) -> TaskDraft:
    i = pick(rng, st["ents"])
    item = st["ents"][i]
    shelf = rng.choice([s for s in SHELVES if s != item["shelf"]])
    return TaskDraft(
        f"Move {item['label']} to shelf {shelf}.", [("find", (item["label"],)), ("move", (i, shelf))], [(i, "shelf")]
    )


def _top_up(rng: random.Random, st: dict, split: str) -> TaskDraft:
    i = pick(rng, st["ents"])
    item = st["ents"][i]
    target = item["qty"] + rng.randint(3, 20)
    intent = [("find", (item["label"],)), ("count", (i,)), ("add", (i, target - item["qty"]))]
    return TaskDraft(f"Bring {item['label']} up to {target}.", intent, [(i, "qty")])


def _ship_and_move(rng: random.Random, st: dict, split: str) -> TaskDraft:
    i = pick(rng, st["ents"])
    item = st["ents"][i]
    n = rng.randint(1, item["qty"])
    shelf = rng.choice([s for s in SHELVES if s != item["shelf"]])
    intent = [("find", (item["label"],)), ("remove", (i, n)), ("move", (i, shelf))]
    return TaskDraft(f"Ship {n} of {item['label']}, move it to shelf {shelf}.", intent, [(i, "qty"), (i, "shelf")])


Inventory.templates = (
    ("inventory/restock", _restock),
    ("inventory/ship", _ship),
    ("inventory/relocate", _relocate),
    ("inventory/top_up", _top_up),
    ("inventory/ship_and_move", _ship_and_move),
)

INVENTORY = Inventory()
