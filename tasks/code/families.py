"""The grammar of code-synthesis problems: families, their hidden conventions,
and the templates that instantiate them.

A *template* is a one-line list/string/number operation with small constants
("Sum the elements of xs greater than {t}.").  Every template belongs to one
*family*, and each family carries a **convention** that the prompt never
states but every solved problem of the family obeys (e.g. "strings are
lower-cased first", "an empty list gives -1").  Visible examples are chosen so
the convention does not show; hidden tests make it matter.  That is what makes
experience useful: a method that learns from solved problems of a family (its
``group_id``) can infer the convention, one that reads only the prompt cannot.

A reference program is assembled from parts so it stays short and regular::

    def f(<arg>):
        <family pre-line(s), acting on the input>
        return <family wrap around the template expression>

``render_reference(..., convention=False)`` gives the convention-free program,
which the generator uses to pick examples that hide the convention and hidden
tests that expose it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

__all__ = ["Family", "Template", "FAMILIES", "TEMPLATES", "render_reference"]


@dataclass(frozen=True)
class Family:
    name: str
    convention: str  # documentation only: never shown to the policy
    pre: tuple[tuple[str, str], ...] = ()  # (arg name, lines run first on that input)
    wrap: str = "{}"  # applied to the returned expression


@dataclass(frozen=True)
class Template:
    name: str
    family: str
    arg: str  # "xs" (list of ints), "s" (string) or "n" (int)
    text: str  # description, formatted with the params
    expr: str  # returned expression, formatted with the params
    params: tuple[tuple[str, tuple], ...] = ()

    def combos(self) -> list[dict]:
        """Every assignment of the template's constants."""
        names = [k for k, _ in self.params]
        return [dict(zip(names, values)) for values in itertools.product(*(v for _, v in self.params))]


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("lower", "strings are lower-cased before anything else", (("s", "s = s.lower()"),)),
        Family("strip", "surrounding spaces are stripped first", (("s", "s = s.strip()"),)),
        Family("abs", "negative numbers count as their absolute value",
               (("xs", "xs = [abs(x) for x in xs]"), ("n", "n = abs(n)"))),
        Family("nozero", "zeros in the input are ignored", (("xs", "xs = [x for x in xs if x != 0]"),)),
        Family("empty", "an empty list returns -1", (("xs", "if not xs:\n    return -1"),)),
        Family("sorted", "the input list is sorted ascending first", (("xs", "xs = sorted(xs)"),)),
        Family("desc", "list results are sorted descending", wrap="sorted({}, reverse=True)"),
        Family("first3", "list results keep at most their first 3 items", wrap="{}[:3]"),
        Family("uniq", "list results drop repeated items, keeping first occurrences", wrap="list(dict.fromkeys({}))"),
        Family("cap", "numeric results are capped at 100", wrap="min({}, 100)"),
        Family("floor0", "negative numeric results become 0", wrap="max({}, 0)"),
    )
}

_CHARS = tuple("abcdefgh")
_T = lambda *a, **p: Template(*a, params=tuple(p.items()))  # noqa: E731 -- compact table below

TEMPLATES: tuple[Template, ...] = (
    # lower
    _T("count_char", "lower", "s", "Count how many times '{c}' occurs in s.", "s.count({c!r})", c=_CHARS),
    _T("reverse_words", "lower", "s", "Reverse the order of the words in s.", "' '.join(s.split()[::-1])"),
    _T("count_starts", "lower", "s", "Count the words in s that start with '{c}'.",
       "len([w for w in s.split() if w[0] == {c!r}])", c=_CHARS),
    # strip
    _T("repeat_str", "strip", "s", "Repeat s {k} times.", "s * {k}", k=(2, 3, 4, 5)),
    _T("reverse_str", "strip", "s", "Reverse the string s.", "s[::-1]"),
    _T("prefix", "strip", "s", "Return the first {k} characters of s.", "s[:{k}]", k=(1, 2, 3, 4, 5, 6)),
    # abs
    _T("sum_gt", "abs", "xs", "Sum the elements of xs greater than {t}.", "sum(x for x in xs if x > {t})", t=tuple(range(10))),
    _T("scale", "abs", "xs", "Multiply each element of xs by {k}.", "[x * {k} for x in xs]", k=tuple(range(2, 10))),
    _T("digit_sum", "abs", "n", "Return the sum of the digits of n.", "sum(int(d) for d in str(n))"),
    # nozero
    _T("count_lt", "nozero", "xs", "Count the elements of xs smaller than {t}.", "len([x for x in xs if x < {t}])",
       t=tuple(range(1, 10))),
    _T("min_elem", "nozero", "xs", "Return the smallest element of xs.", "min(xs)"),
    _T("mean_int", "nozero", "xs", "Return the sum of xs divided by its length, rounded down.", "sum(xs) // len(xs)"),
    # empty
    _T("max_times", "empty", "xs", "Return the largest element of xs times {k}.", "max(xs) * {k}", k=tuple(range(2, 10))),
    _T("last_plus", "empty", "xs", "Return the last element of xs plus {k}.", "xs[-1] + {k}", k=tuple(range(1, 10))),
    _T("count_div", "empty", "xs", "Count the elements of xs divisible by {k}.", "len([x for x in xs if x % {k} == 0])",
       k=(2, 3, 4, 5)),
    # desc
    _T("filter_map", "desc", "xs", "Keep the elements of xs greater than {t}, each times {k}.",
       "[x * {k} for x in xs if x > {t}]", t=tuple(range(6)), k=(2, 3, 4, 5)),
    _T("dedupe", "desc", "xs", "Remove repeated elements from xs, keeping first occurrences.", "list(dict.fromkeys(xs))"),
    _T("word_lengths", "desc", "s", "Return the length of each word in s.", "[len(w) for w in s.split()]"),
    # first3
    _T("running_sum", "first3", "xs", "Return the running sums of xs.", "[sum(xs[:i + 1]) for i in range(len(xs))]"),
    _T("char_positions", "first3", "s", "Return the positions of '{c}' in s.",
       "[i for i, ch in enumerate(s) if ch == {c!r}]", c=_CHARS),
    _T("mod_filter", "first3", "xs", "Return the elements of xs divisible by {k}.", "[x for x in xs if x % {k} == 0]",
       k=(2, 3, 4, 5)),
    # uniq
    _T("clamp", "uniq", "xs", "Clamp each element of xs to the range {lo} to {hi}.", "[min(max(x, {lo}), {hi}) for x in xs]",
       lo=(0, 1, 2, 3), hi=(6, 7, 8, 9)),
    _T("mod_map", "uniq", "xs", "Return each element of xs modulo {k}.", "[x % {k} for x in xs]", k=tuple(range(3, 10))),
    _T("long_words", "uniq", "s", "Return the words of s longer than {k} letters.", "[w for w in s.split() if len(w) > {k}]",
       k=(1, 2, 3)),
    # cap
    _T("sum_sq", "cap", "xs", "Return the sum of the squares of xs.", "sum(x * x for x in xs)"),
    _T("str_score", "cap", "s", "Return {k} times the length of s.", "len(s) * {k}", k=tuple(range(2, 10))),
    _T("sum_times", "cap", "xs", "Return {k} times the sum of xs.", "sum(xs) * {k}", k=tuple(range(2, 10))),
    # floor0
    _T("sum_minus", "floor0", "xs", "Return the sum of xs minus {t}.", "sum(xs) - {t}", t=tuple(range(1, 21))),
    _T("last_minus_first", "floor0", "xs", "Return the last element of xs minus the first.", "xs[-1] - xs[0]"),
    _T("count_minus", "floor0", "s", "Return the number of '{c}' in s minus {t}.", "s.count({c!r}) - {t}",
       c=_CHARS, t=(1, 2, 3)),
    # sorted
    _T("running_max", "sorted", "xs", "Return the running maximum of xs.", "[max(xs[:i + 1]) for i in range(len(xs))]"),
    _T("first_k", "sorted", "xs", "Return the first {k} elements of xs.", "xs[:{k}]", k=(1, 2, 3, 4)),
    _T("nth_default", "sorted", "xs", "Return xs[{k}], or {d} if xs is too short.", "xs[{k}] if len(xs) > {k} else {d}",
       k=(0, 1, 2, 3), d=(-1, 0, 99)),
)


def render_reference(template: Template, params: dict, convention: bool = True) -> str:
    """The canonical solution: ``def f(arg):`` plus 1-3 body lines."""
    family = FAMILIES[template.family]
    lines = [f"def f({template.arg}):"]
    expr = template.expr.format(**params)
    if convention:
        pre = dict(family.pre).get(template.arg, "")
        lines += ["    " + line for line in pre.splitlines()]
        expr = family.wrap.format(expr)
    lines.append(f"    return {expr}")
    return "\n".join(lines) + "\n"
