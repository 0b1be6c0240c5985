"""How methods are named and coloured in every table and figure (the paper's names).

A method missing here (a new baseline) is shown under its config name in a
colour of its own; add a line to give it a display name.
"""

from __future__ import annotations

DISPLAY = {
    "vanilla": "Vanilla",
    "grpo": "GRPO",
    "retrieval_rl": "Retrieval RL",
    "opsd": "OPSD",
    "sdpo": "SDPO",
    "sdft": "SDFT",
    "skill_sd": "Skill-SD",
    "lopd": "LOPD",
}
DOMAINS = {"tooluse": "Tool use", "code": "Code"}
# Okabe-Ito (colour-blind safe); LOPD in the strongest colour
COLORS = {
    "vanilla": "#7f7f7f",
    "grpo": "#000000",
    "retrieval_rl": "#56B4E9",
    "opsd": "#E69F00",
    "sdpo": "#009E73",
    "sdft": "#0072B2",
    "skill_sd": "#CC79A7",
    "lopd": "#D55E00",
}
_EXTRA = ["#8c564b", "#17becf", "#bcbd22", "#9467bd", "#1f77b4"]


def display(method: str) -> str:
    return DISPLAY.get(method, method)


def domain_name(domain: str) -> str:
    return DOMAINS.get(domain, domain)


def color(method: str, others: list[str] | None = None) -> str:
    if method in COLORS:
        return COLORS[method]
    unknown = sorted(m for m in (others or [method]) if m not in COLORS)
    i = unknown.index(method) if method in unknown else 0
    return _EXTRA[i % len(_EXTRA)]


def ordered(methods) -> list[str]:
    """Vanilla, then the paper's order, then any others by name; LOPD last."""
    given = set(methods)
    known = [m for m in DISPLAY if m in given and m != "lopd"]
    return known + sorted(m for m in given if m not in DISPLAY) + (["lopd"] if "lopd" in given else [])
