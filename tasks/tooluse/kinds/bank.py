"""Bank: accounts with an owner and a balance.

Tools in role order: lookup, balance, deposit, withdraw, close, approve.

Hidden rules (every variant draws one main rule that touches most tasks, about
half draw a second one): amounts in cents ("amounts are in cents: 70 is
7000"); withdrawals (over a threshold) need ``approve(id)`` first; deposits and
withdrawals both need ``approve(id)`` first; second rules also include closing
needs ``approve(id)`` and deposits over a threshold need ``approve(id)``.
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
    id_prefixes = ("a",)
    ops = {
        "lookup": (Param("who", "person"),),
        "balance": (_ID,),
        "deposit": (_ID, _AMT),
        "withdraw": (_ID, _AMT),
        "close": (_ID,),
        "approve": (_ID,),
    }
    synonyms = {
        "lookup": ("find", "lookup", "acct", "acct_of", "get_id", "whois", "id_of"),
        "balance": ("bal", "balance", "funds", "show", "peek", "read"),
        "deposit": ("put", "deposit", "credit", "add", "pay_in", "dep"),
        "withdraw": ("take", "debit", "draw", "pay_out", "wd", "withdraw"),
        "close": ("close", "shut", "end", "retire", "drop", "seal"),
        "approve": ("approve", "verify", "ok", "auth", "sign", "allow"),
    }

    def draw_rules(self, rng: random.Random) -> dict:
        """``unit`` (1 or 100) and ``approve``: ((op, over), ...) -- op needs approve(id) above ``over``."""
        main = rng.choice(["cents", "withdraw", "withdraw", "money"])
        unit, approve = 1, {}
        if main == "cents":
            unit = 100
        elif main == "withdraw":
            approve["withdraw"] = rng.choice([0, 10])
        else:
            approve["deposit"] = approve["withdraw"] = 0
        if rng.random() < 0.5:
            extra = rng.choice(
                [x for x in ("cents", "close", "deposit") if x != main and not (x == "deposit" and main == "money")]
            )
            if extra == "cents":
                unit = 100
            elif extra == "close":
                approve["close"] = 0
            else:
                approve["deposit"] = rng.choice([20, 40])
        return {"unit": unit, "approve": tuple(sorted(approve.items()))}

    def rule_names(self, rules: dict) -> list[str]:
        out = ["amounts in cents"] if rules["unit"] != 1 else []
        approve = dict(rules["approve"])
        if approve.get("deposit") == 0 and approve.get("withdraw") == 0:
            out.append("deposit and withdraw need approve")
            approve = {k: v for k, v in approve.items() if k == "close"}
        out += [f"{op}{f' over {over}' if over else ''} needs approve" for op, over in sorted(approve.items())]
        return out

    def make_state(self, rng: random.Random, split: str) -> dict:
        n = rng.randint(4, 6)
        owners = unique(rng, lambda: names.person(rng, split), n, key=lambda s: s.split()[-1])
        nums = rng.sample(range(10, 90), n)
        bals = [rng.randrange(50, 201, 10)] + [rng.randrange(20, 201, 10) for _ in range(n - 1)]
        ents = {num: {"owner": o, "bal": b, "ok": False, "active": True} for num, o, b in zip(nums, owners, bals)}
        return {"ents": ents, "people": ()}

    def people(self, st: dict) -> tuple[str, ...]:
        return tuple(e["owner"] for e in st["ents"].values() if e["active"])

    def apply(self, st: dict, variant, op: str, args: tuple) -> str:
        ents = st["ents"]
        if op == "lookup":
            return variant.fmt_id(next(n for n, e in ents.items() if e["active"] and e["owner"] == args[0]))
        acct = ents[args[0]]
        if op == "balance":
            return f"balance {acct['bal'] * variant.unit}"
        if op == "approve":
            acct["ok"] = True
            return "ok"
        over = dict(variant.rules["approve"]).get(op)
        amount = args[1] if op in ("deposit", "withdraw") else 0
        if over is not None and not acct["ok"] and (op == "close" or amount > over):
            raise RuleError(("approve", (args[0],)), over=over)
        if op == "deposit":
            acct["bal"] += args[1]
        elif op == "withdraw":
            if args[1] > acct["bal"]:
                raise ToolError(f"balance is only {acct['bal'] * variant.unit}")
            acct["bal"] -= args[1]
        elif op == "close":
            if acct["bal"]:
                raise ToolError("balance must be 0")
            acct["active"] = False
        return "ok"


# --------------------------------------------------------------------------- templates
def _deposit(rng: random.Random, st: dict, split: str) -> TaskDraft:
    a = pick(rng, st["ents"])
    amt = rng.randrange(5, 100, 5)
    owner = st["ents"][a]["owner"]
    return TaskDraft(f"Deposit {amt} for {owner}.", [("lookup", (owner,)), ("deposit", (a, amt))], [(a, "bal")])


def _withdraw(rng: random.Random, st: dict, split: str) -> TaskDraft:
    a = pick(rng, st["ents"])
    acct = st["ents"][a]
    amt = rng.randrange(10, min(acct["bal"], 95) + 1, 5)
    return TaskDraft(
        f"Withdraw {amt} for {acct['owner']}.", [("lookup", (acct["owner"],)), ("withdraw", (a, amt))], [(a, "bal")]
    )


def _transfer(rng: random.Random, st: dict, split: str) -> TaskDraft:
    a = pick(rng, st["ents"])
    b = pick(rng, st["ents"], lambda e: e is not st["ents"][a])
    src, dst = st["ents"][a], st["ents"][b]
    amt = rng.randrange(10, min(src["bal"], 95) + 1, 5)
    intent = [("lookup", (src["owner"],)), ("lookup", (dst["owner"],)), ("withdraw", (a, amt)), ("deposit", (b, amt))]
    return TaskDraft(f"Move {amt} from {src['owner']} to {dst['owner']}.", intent, [(a, "bal"), (b, "bal")])


def _withdraw_to(rng: random.Random, st: dict, split: str) -> TaskDraft:
    a = pick(rng, st["ents"], lambda e: e["bal"] >= 40)
    acct = st["ents"][a]
    keep = rng.randrange(10, acct["bal"] - 10 + 1, 10)
    intent = [("lookup", (acct["owner"],)), ("balance", (a,)), ("withdraw", (a, acct["bal"] - keep))]
    return TaskDraft(f"Withdraw all but {keep} for {acct['owner']}.", intent, [(a, "bal")])


def _close(rng: random.Random, st: dict, split: str) -> TaskDraft:
    a = pick(rng, st["ents"])
    acct = st["ents"][a]
    intent = [("lookup", (acct["owner"],)), ("balance", (a,)), ("withdraw", (a, acct["bal"])), ("close", (a,))]
    return TaskDraft(f"Empty and close {acct['owner']}.", intent, [(a, "bal"), (a, "active")])


Bank.templates = (
    ("bank/deposit_by_name", _deposit),
    ("bank/withdraw_by_name", _withdraw),
    ("bank/transfer_by_name", _transfer),
    ("bank/withdraw_to", _withdraw_to),
    ("bank/close_by_name", _close),
)

BANK = Bank()
