"""Procedural entity names for the tool-use environments, and their written forms.

Words are two syllables built from a fixed alphabet ("mara", "velk").  The word
list is split once, deterministically, into a train pool and a disjoint test
pool, so every person ("Mara Velk") and label ("velk lamp": word + kind noun)
of the test split is unseen in training.

A variant may demand that names be *written* in a particular form (a hidden
rule): persons in plain, lower-case or surname-only form, labels in plain,
hyphenated or noun-first form.  :func:`parse_person` and :func:`parse_label`
turn an agent's argument back into the canonical name or raise a
:class:`FormError` whose message states the form the variant expects.
"""

from __future__ import annotations

import random
import zlib
from itertools import product

__all__ = [
    "FormError",
    "NOUNS",
    "PERSON_FORMS",
    "LABEL_FORMS",
    "words",
    "person",
    "label",
    "person_form",
    "label_form",
    "parse_person",
    "parse_label",
]

_ONSETS = "b d f g h k l m n p r s t v z".split()
_VOWELS = "a e i o u".split()
_CODAS = ["", "n", "r", "l", "k", "s"]

#: nouns that make labels per kind ("velk lamp", "velk review", "velk saga")
NOUNS = {
    "inventory": ("lamp", "bolt", "cup", "rope", "fan", "jar", "pen", "box", "gear", "tile", "pipe", "mug"),
    "calendar": ("review", "sync", "demo", "call", "lunch", "party", "talk", "meet", "class", "trip"),
    "library": ("saga", "tide", "song", "atlas", "myth", "tale", "poem", "guide", "map", "diary"),
}
_ALL_NOUNS = frozenset(n for group in NOUNS.values() for n in group)

PERSON_FORMS = ("plain", "lower", "last")
LABEL_FORMS = ("plain", "hyphen", "rev")

_PERSON_HINT = {
    "plain": "write names in full as given",
    "lower": "names are written in lower case",
    "last": "names are looked up by surname only",
}
_LABEL_HINT = {
    "plain": "write names as given",
    "hyphen": "names are written with a hyphen: velk-lamp",
    "rev": "names are written noun first: lamp velk",
}


class FormError(ValueError):
    """An argument names something in a form the variant does not accept."""


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


# --------------------------------------------------------------------------- forms
def person_form(name: str, form: str) -> str:
    if form == "lower":
        return name.lower()
    if form == "last":
        return name.split()[-1]
    return name


def label_form(name: str, form: str) -> str:
    word, noun = name.split()
    if form == "hyphen":
        return f"{word}-{noun}"
    if form == "rev":
        return f"{noun} {word}"
    return name


def parse_person(arg: str, form: str, known: tuple[str, ...] | list[str]) -> str:
    """The canonical known name ``arg`` denotes in ``form``; FormError otherwise."""
    for name in known:
        if person_form(name, form) == arg:
            return name
    for other in PERSON_FORMS:
        if other != form and any(person_form(name, other) == arg for name in known):
            raise FormError(_PERSON_HINT[form])
    raise FormError(f"unknown name {arg[:20]}")


def _detect_label(arg: str) -> tuple[str, str] | None:
    """(canonical, form) of a syntactically valid label, else None."""
    text = arg.strip().lower()
    if text.count("-") == 1 and " " not in text:
        word, noun = text.split("-")
        return (f"{word} {noun}", "hyphen") if noun in _ALL_NOUNS else None
    parts = text.split()
    if len(parts) != 2:
        return None
    if parts[1] in _ALL_NOUNS and parts[0] not in _ALL_NOUNS:
        return text, "plain"
    if parts[0] in _ALL_NOUNS and parts[1] not in _ALL_NOUNS:
        return f"{parts[1]} {parts[0]}", "rev"
    return None


def parse_label(arg: str, form: str) -> str:
    """The canonical label ``arg`` writes in ``form``; FormError otherwise."""
    found = _detect_label(arg)
    if found is None:
        raise FormError(f"bad name {arg[:20]}")
    canonical, written = found
    if written != form:
        raise FormError(_LABEL_HINT[form])
    return canonical
