"""Inventory: items with a stock level and a shelf.

Hidden rules a variant may draw: item names written hyphenated or noun first;
some of add / remove / move need the item scanned with ``scan(id)`` first.
"""

from __future__ import annotations

import random

from .. import names
from ..spec import Kind, Param, RuleError, TaskDraft, ToolError, pick, unique

_ID = Param("id", "id")
SHELVES = range(1, 10)


class Inventory(Kind):
    name = "inventory"
    entity = "item"
    gone = "gone"
    id_prefixes = ("sku", "it", "itm")
    ops = {
        "find": (Param("item", "label"),),
        "count": (_ID,),
        "add": (_ID, Param("n", "int")),
        "remove": (_ID, Param("n", "int")),
        "scan": (_ID,),
        "move": (_ID, Param("shelf", "int")),
    }
    synonyms = {
        "find": ("find", "sku_of", "lookup", "item", "locate", "get_sku"),
        "count": ("count", "qty", "stock", "level", "howmany", "tally"),
        "add": ("add", "restock", "put", "fill", "load", "stock_in"),
        "remove": ("remove", "ship", "take", "pull", "pick", "stock_out"),
        "scan": ("scan", "check", "tag", "mark", "audit", "inspect"),
        "move": ("move", "shelve", "place", "put_on", "relocate", "slot"),
    }

    def draw_rules(self, rng: random.Random) -> dict:
        return {
            "label_form": rng.choice(["plain", "plain", "hyphen", "rev"]),
            "scan_ops": tuple(sorted(rng.sample(["add", "remove", "move"], rng.randint(1, 2)))),
        }

    def make_state(self, rng: random.Random, split: str) -> dict:
        n = rng.randint(4, 6)
        labels = unique(rng, lambda: names.label(rng, split, self.name), n)
        nums = rng.sample(range(10, 90), n)
        ents = {
            num: {"label": lab, "qty": rng.randint(2, 40), "shelf": rng.choice(SHELVES), "ok": False, "active": True}
            for num, lab in zip(nums, labels)
        }
        return {"ents": ents, "people": ()}

    def apply(self, st: dict, variant, op: str, args: tuple) -> str:
        ents = st["ents"]
        if op == "find":
            found = [n for n, e in ents.items() if e["active"] and e["label"] == args[0]]
            if not found:
                raise ToolError(f"no item {args[0]}")
            return variant.fmt_id(found[0])
        item = ents[args[0]]
        if op in variant.rules["scan_ops"] and not item["ok"]:
            raise RuleError(("scan", (args[0],)))
        if op == "count":
            return f"stock {item['qty']}"
        if op == "scan":
            item["ok"] = True
        elif op == "add":
            if args[1] <= 0:
                raise ToolError("n must be positive")
            item["qty"] += args[1]
        elif op == "remove":
            if not 0 < args[1] <= item["qty"]:
                raise ToolError(f"n must be 1 to {item['qty']} (stock {item['qty']})")
            item["qty"] -= args[1]
        elif op == "move":
            if args[1] not in SHELVES:
                raise ToolError("shelves are 1 to 9")
            item["shelf"] = args[1]
        return "ok"


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
    return TaskDraft(f"Move {item['label']} to shelf {shelf}.", [("find", (item["label"],)), ("move", (i, shelf))], [(i, "shelf")])


def _top_up(rng: random.Random, st: dict, split: str) -> TaskDraft:
    i = pick(rng, st["ents"])
    item = st["ents"][i]
    target = item["qty"] + rng.randint(3, 20)
    intent = [("find", (item["label"],)), ("count", (i,)), ("add", (i, target - item["qty"]))]
    return TaskDraft(f"Bring the stock of {item['label']} up to {target}.", intent, [(i, "qty")])


def _ship_and_move(rng: random.Random, st: dict, split: str) -> TaskDraft:
    i = pick(rng, st["ents"])
    item = st["ents"][i]
    n = rng.randint(1, item["qty"])
    shelf = rng.choice([s for s in SHELVES if s != item["shelf"]])
    intent = [("find", (item["label"],)), ("remove", (i, n)), ("move", (i, shelf))]
    return TaskDraft(f"Ship {n} of {item['label']}, then put it on shelf {shelf}.", intent, [(i, "qty"), (i, "shelf")])


Inventory.templates = (
    ("inventory/restock", _restock),
    ("inventory/ship", _ship),
    ("inventory/relocate", _relocate),
    ("inventory/top_up", _top_up),
    ("inventory/ship_and_move", _ship_and_move),
)

INVENTORY = Inventory()
