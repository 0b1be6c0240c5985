"""Bank: accounts with an owner and a balance.

Hidden rules a variant may draw: owner names written in lower case or by
surname only; amounts in cents; withdrawals over a threshold need
``approve(id)`` first; closing an account needs ``approve(id)`` first.
"""

from __future__ import annotations

import random

from .. import names
from ..spec import Kind, Param, RuleError, TaskDraft, ToolError, pick, unique

_ID, _AMT = Param("id", "id"), Param("amt", "amt")


class Bank(Kind):
    name = "bank"
    entity = "account"
    gone = "closed"
    id_prefixes = ("acc", "ac", "acct")
    ops = {
        "lookup": (Param("name", "person"),),
        "balance": (_ID,),
        "deposit": (_ID, _AMT),
        "withdraw": (_ID, _AMT),
        "approve": (_ID,),
        "close": (_ID,),
    }
    synonyms = {
        "lookup": ("find_acct", "lookup", "acct_of", "get_id", "whois", "acct", "find", "id_of"),
        "balance": ("bal", "balance", "get_bal", "funds", "show", "peek", "read"),
        "deposit": ("put", "deposit", "credit", "add", "pay_in", "dep"),
        "withdraw": ("take", "withdraw", "debit", "draw", "pay_out", "wd"),
        "approve": ("approve", "verify", "ok", "auth", "sign", "allow"),
        "close": ("close", "shut", "end", "retire", "drop", "seal"),
    }

    def draw_rules(self, rng: random.Random) -> dict:
        extras = rng.sample(["over", "close", "cents"], rng.randint(1, 2))
        return {
            "person_form": rng.choice(["plain", "plain", "lower", "last"]),
            "approve_over": rng.choice([20, 30, 40, 50]) if "over" in extras else None,
            "approve_close": "close" in extras,
            "unit": 100 if "cents" in extras else 1,
        }

    def make_state(self, rng: random.Random, split: str) -> dict:
        n = rng.randint(4, 6)
        owners = unique(rng, lambda: names.person(rng, split), n, key=lambda s: s.split()[-1])
        nums = rng.sample(range(10, 90), n)
        ents = {num: {"owner": o, "bal": rng.randrange(20, 201, 10), "ok": False, "active": True} for num, o in zip(nums, owners)}
        return {"ents": ents, "people": ()}

    def people(self, st: dict) -> tuple[str, ...]:
        return tuple(e["owner"] for e in st["ents"].values() if e["active"])

    def apply(self, st: dict, variant, op: str, args: tuple) -> str:
        ents, rules = st["ents"], variant.rules
        if op == "lookup":
            return variant.fmt_id(next(n for n, e in ents.items() if e["active"] and e["owner"] == args[0]))
        acct = ents[args[0]]
        if op == "balance":
            return f"balance {acct['bal'] * variant.unit}"
        if op == "approve":
            acct["ok"] = True
        elif op == "deposit":
            acct["bal"] += args[1]
        elif op == "withdraw":
            limit = rules["approve_over"]
            if limit is not None and args[1] > limit and not acct["ok"]:
                raise RuleError(("approve", (args[0],)), over=limit)
            if args[1] > acct["bal"]:
                raise ToolError(f"insufficient funds: balance {acct['bal'] * variant.unit}")
            acct["bal"] -= args[1]
        elif op == "close":
            if rules["approve_close"] and not acct["ok"]:
                raise RuleError(("approve", (args[0],)))
            if acct["bal"]:
                raise ToolError("balance must be 0 to close")
            acct["active"] = False
        return "ok"


# --------------------------------------------------------------------------- templates
def _deposit(rng: random.Random, st: dict, split: str) -> TaskDraft:
    a = pick(rng, st["ents"])
    amt = rng.randrange(5, 100, 5)
    owner = st["ents"][a]["owner"]
    return TaskDraft(f"Deposit {amt} into the account of {owner}.", [("lookup", (owner,)), ("deposit", (a, amt))], [(a, "bal")])


def _withdraw(rng: random.Random, st: dict, split: str) -> TaskDraft:
    a = pick(rng, st["ents"])
    acct = st["ents"][a]
    amt = rng.randrange(10, min(acct["bal"], 95) + 1, 5)
    return TaskDraft(
        f"Withdraw {amt} from the account of {acct['owner']}.",
        [("lookup", (acct["owner"],)), ("withdraw", (a, amt))],
        [(a, "bal")],
    )


def _transfer(rng: random.Random, st: dict, split: str) -> TaskDraft:
    a = pick(rng, st["ents"])
    b = pick(rng, st["ents"], lambda e: e is not st["ents"][a])
    src, dst = st["ents"][a], st["ents"][b]
    amt = rng.randrange(10, min(src["bal"], 95) + 1, 5)
    intent = [("lookup", (src["owner"],)), ("lookup", (dst["owner"],)), ("withdraw", (a, amt)), ("deposit", (b, amt))]
    return TaskDraft(f"Move {amt} from {src['owner']} to {dst['owner']}.", intent, [(a, "bal"), (b, "bal")])


def _withdraw_half(rng: random.Random, st: dict, split: str) -> TaskDraft:
    a = pick(rng, st["ents"])
    acct = st["ents"][a]
    intent = [("lookup", (acct["owner"],)), ("balance", (a,)), ("withdraw", (a, acct["bal"] // 2))]
    return TaskDraft(f"Withdraw half of the balance of {acct['owner']}.", intent, [(a, "bal")])


def _close(rng: random.Random, st: dict, split: str) -> TaskDraft:
    a = pick(rng, st["ents"])
    acct = st["ents"][a]
    intent = [("lookup", (acct["owner"],)), ("balance", (a,)), ("withdraw", (a, acct["bal"])), ("close", (a,))]
    return TaskDraft(f"Empty and close the account of {acct['owner']}.", intent, [(a, "bal"), (a, "active")])


Bank.templates = (
    ("bank/deposit_by_name", _deposit),
    ("bank/withdraw_by_name", _withdraw),
    ("bank/transfer_by_name", _transfer),
    ("bank/withdraw_half", _withdraw_half),
    ("bank/close_by_name", _close),
)

BANK = Bank()
