"""Procedural entity names for the tool-use environments.

Words are two syllables built from a fixed alphabet ("mara", "velk").  The word
list is split once, deterministically, into a train pool and a disjoint test
pool, so every person ("Mara Velk") and label ("velk lamp": word + kind noun)
of the test split is unseen in training.

Names are written verbatim: a call names a person or a label exactly as the
instruction spells it (whitespace and letter case are forgiven).
"""

from __future__ import annotations

import random
import re
import zlib
from itertools import product

__all__ = ["NameError_", "NOUNS", "words", "person", "label", "norm", "parse_person", "parse_label"]

_ONSETS = "b d f g h k l m n p r s t v z".split()
_VOWELS = "a e i o u".split()
_CODAS = ["", "n", "r", "l", "k", "s"]

#: nouns that make labels per kind ("velk lamp", "velk demo", "velk saga")
NOUNS = {
    "inventory": ("lamp", "bolt", "cup", "rope", "fan", "jar", "pen", "box", "gear", "tile", "pipe", "mug"),
    "calendar": ("sync", "demo", "call", "lunch", "party", "talk", "meet", "class", "trip", "visit"),
    "library": ("saga", "tide", "song", "atlas", "myth", "tale", "poem", "guide", "map", "diary"),
}
_ALL_NOUNS = frozenset(n for group in NOUNS.values() for n in group)
_LABEL = re.compile(r"[a-z][a-z ]{0,23}")


class NameError_(ValueError):
    """An argument that names no known person, or is no valid label."""


def _build_pools() -> dict[str, list[str]]:
    syll = [o + v for o, v in product(_ONSETS, _VOWELS)]
    pools: dict[str, list[str]] = {"train": [], "test": []}
    for a, b, c in product(syll, syll, _CODAS):
        word = a + b + c
        if word in _ALL_NOUNS:
            continue
        pools["test" if zlib.crc32(word.encode()) % 4 == 0 else "train"].append(word)
    return pools


_POOLS = _build_pools()


def words(split: str) -> list[str]:
    """The word pool of ``split`` ("train" or "test"); the two pools are disjoint."""
    return _POOLS["test" if split == "test" else "train"]


def person(rng: random.Random, split: str) -> str:
    pool = words(split)
    return f"{rng.choice(pool).capitalize()} {rng.choice(pool).capitalize()}"


def label(rng: random.Random, split: str, kind: str) -> str:
    return f"{rng.choice(words(split))} {rng.choice(NOUNS[kind])}"


def norm(text: str) -> str:
    """Whitespace collapsed, lower case: the key names are compared by."""
    return " ".join(text.split()).lower()


def parse_person(arg: str, known: tuple[str, ...] | list[str]) -> str:
    """The known name ``arg`` spells; NameError_ otherwise."""
    key = norm(arg)
    for name in known:
        if norm(name) == key:
            return name
    raise NameError_(f"unknown {arg[:16]}")


def parse_label(arg: str) -> str:
    """The canonical (normalised) label ``arg`` spells; NameError_ if it is no label."""
    text = norm(arg)
    if not _LABEL.fullmatch(text):
        raise NameError_(f"bad name {arg[:16]}")
    return text
