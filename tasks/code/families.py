"""The grammar of code-synthesis problems: templates, hidden conventions and
the projects that carry them.

A *template* is a one-line list/string/number operation with small constants
("Sum the elements of xs greater than {t}.").  A *convention* is an unstated
rule ("strings are lower-cased first", "an empty list gives -1", "numeric
results are capped at 100").  A *project* (``p-17``) has one convention, or
one input-side and one output-side convention, and every solved problem of the
project obeys them.  Conventions are **independent of the template**: the same
template appears in many projects with different conventions, so the prompt's
task line never tells the convention; only the project does, and a model can
learn a project's convention only from its solved problems (its ``group_id``).
Some projects are test-only, so there memorizing project -> convention cannot
help either.

A convention applies to a template when its types fit (an input-side
convention needs the right argument kind, an output-side one the right result
kind) and it actually changes some result (``generator.applied_conventions``
checks that on probe inputs); a project uses only templates where at least one
of its conventions applies, so its convention matters for every task.

A reference program is assembled from parts so it stays short and regular::

    def f(<arg>):
        <input-side convention line(s)>
        return <output-side convention around the template expression>

``render_reference(template, params, ())`` gives the convention-free program,
which the generator uses to pick visible examples that hide the convention
and hidden tests that expose it.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

__all__ = [
    "Convention",
    "Template",
    "Project",
    "CONVENTIONS",
    "TEMPLATES",
    "PROJECTS",
    "WARMSTART_PROJECT_BASE",
    "warmstart_project",
    "PRE_CONVENTIONS",
    "WRAP_CONVENTIONS",
    "render_reference",
]


@dataclass(frozen=True)
class Convention:
    name: str
    doc: str  # never in a prompt; a failing hidden test that checks the convention names it (its test name)
    pre: tuple[tuple[str, str], ...] = ()  # (arg kind, lines run first on that input)
    wrap: str = ""  # applied to the returned expression; "" for none
    outs: tuple[str, ...] = ()  # result kinds the wrap applies to

    def fits(self, template: Template) -> bool:
        """Whether the types allow this convention on ``template`` (not yet whether it matters)."""
        if self.pre:
            return template.arg in dict(self.pre)
        return template.out in self.outs


@dataclass(frozen=True)
class Template:
    name: str
    arg: str  # "xs" (list of ints), "s" (string) or "n" (int)
    out: str  # result kind: "int", "list" or "str"
    text: str  # description, formatted with the params
    expr: str  # returned expression, formatted with the params
    params: tuple[tuple[str, tuple], ...] = ()

    def combos(self) -> list[dict]:
        """Every assignment of the template's constants."""
        names = [k for k, _ in self.params]
        return [dict(zip(names, values)) for values in itertools.product(*(v for _, v in self.params))]


@dataclass(frozen=True)
class Project:
    id: str  # the task's group_id ("p-17")
    conventions: tuple[str, ...]  # one, or one input-side + one output-side
    test_only: bool  # never appears in the train split
    name: str = ""  # shown in the prompt ("project: Velmora"): a name retrieval can find

    @property
    def shown(self) -> str:
        return self.name or self.id


_SYLLABLES = (
    "ba",
    "ve",
    "lo",
    "mi",
    "ra",
    "ten",
    "dor",
    "ka",
    "sul",
    "fen",
    "mar",
    "os",
    "qui",
    "zan",
    "pel",
    "tor",
    "wen",
    "il",
    "gra",
    "nu",
)


def _pseudo_word(rng: random.Random) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(3)).capitalize()


CONVENTIONS: dict[str, Convention] = {
    c.name: c
    for c in (
        # input side: a line run first
        Convention("lower", "strings are lower-cased before anything else", (("s", "s = s.lower()"),)),
        Convention("strip", "surrounding spaces are stripped first", (("s", "s = s.strip()"),)),
        Convention(
            "abs",
            "negative numbers count as their absolute value",
            (("xs", "xs = [abs(x) for x in xs]"), ("n", "n = abs(n)")),
        ),
        Convention("nozero", "zeros in the input are ignored", (("xs", "xs = [x for x in xs if x != 0]"),)),
        Convention("empty", "an empty list returns -1", (("xs", "if not xs:\n    return -1"),)),
        Convention("sorted", "the input list is sorted ascending first", (("xs", "xs = sorted(xs)"),)),
        # output side: a wrap around the result
        Convention("desc", "list results are sorted descending", wrap="sorted({}, reverse=True)", outs=("list",)),
        Convention("first3", "list results keep at most their first 3 items", wrap="{}[:3]", outs=("list",)),
        Convention(
            "uniq",
            "list results drop repeated items, keeping first occurrences",
            wrap="list(dict.fromkeys({}))",
            outs=("list",),
        ),
        Convention("cap", "numeric results are capped at 100", wrap="min({}, 100)", outs=("int",)),
        Convention("floor0", "negative numeric results become 0", wrap="max({}, 0)", outs=("int",)),
    )
}
PRE_CONVENTIONS = tuple(c for c in CONVENTIONS.values() if c.pre)
WRAP_CONVENTIONS = tuple(c for c in CONVENTIONS.values() if c.wrap)

_CHARS = tuple("abcdefgh")
_T = lambda *a, **p: Template(*a, params=tuple(p.items()))  # noqa: E731 -- compact table below

TEMPLATES: tuple[Template, ...] = (
    # strings
    _T("remove_char", "s", "str", "Remove every '{c}' from s.", "s.replace({c!r}, '')", c=_CHARS),
    _T("reverse_words", "s", "list", "Return the words of s in reverse order.", "s.split()[::-1]"),
    _T(
        "starts_with",
        "s",
        "list",
        "Return the words of s that start with '{c}'.",
        "[w for w in s.split() if w[0] == {c!r}]",
        c=_CHARS,
    ),
    _T("repeat_str", "s", "str", "Repeat s {k} times.", "s * {k}", k=(2, 3, 4, 5)),
    _T("reverse_str", "s", "str", "Reverse the string s.", "s[::-1]"),
    _T("prefix", "s", "str", "Return the first {k} characters of s.", "s[:{k}]", k=(1, 2, 3, 4, 5, 6)),
    _T("word_lengths", "s", "list", "Return the length of each word in s.", "[len(w) for w in s.split()]"),
    _T(
        "char_positions",
        "s",
        "list",
        "Return the positions of '{c}' in s.",
        "[i for i, ch in enumerate(s) if ch == {c!r}]",
        c=_CHARS,
    ),
    _T(
        "long_words",
        "s",
        "list",
        "Return the words of s longer than {k} letters.",
        "[w for w in s.split() if len(w) > {k}]",
        k=(1, 2, 3),
    ),
    _T("str_score", "s", "int", "Return {k} times the length of s.", "len(s) * {k}", k=tuple(range(2, 10))),
    _T(
        "count_minus",
        "s",
        "int",
        "Return the number of '{c}' in s minus {t}.",
        "s.count({c!r}) - {t}",
        c=_CHARS,
        t=(1, 2, 3),
    ),
    # numbers
    _T(
        "digit_sum",
        "n",
        "int",
        "Return {k} times the sum of the digits of n.",
        "sum(int(d) for d in str(n)) * {k}",
        k=tuple(range(3, 10)),
    ),
    _T("n_minus", "n", "int", "Return n minus {t}.", "n - {t}", t=tuple(range(1, 21))),
    # lists -> number
    _T(
        "sum_gt",
        "xs",
        "int",
        "Sum the elements of xs greater than {t}.",
        "sum(x for x in xs if x > {t})",
        t=tuple(range(10)),
    ),
    _T(
        "count_lt",
        "xs",
        "int",
        "Count the elements of xs smaller than {t}.",
        "len([x for x in xs if x < {t}])",
        t=tuple(range(1, 10)),
    ),
    _T("min_elem", "xs", "int", "Return the smallest element of xs.", "min(xs)"),
    _T("mean_int", "xs", "int", "Return the sum of xs divided by its length, rounded down.", "sum(xs) // len(xs)"),
    _T("max_times", "xs", "int", "Return the largest element of xs times {k}.", "max(xs) * {k}", k=tuple(range(2, 10))),
    _T("last_plus", "xs", "int", "Return the last element of xs plus {k}.", "xs[-1] + {k}", k=tuple(range(1, 10))),
    _T(
        "count_div",
        "xs",
        "int",
        "Count the elements of xs divisible by {k}.",
        "len([x for x in xs if x % {k} == 0])",
        k=(2, 3, 4, 5),
    ),
    _T("sum_sq", "xs", "int", "Return the sum of the squares of xs.", "sum(x * x for x in xs)"),
    _T("sum_times", "xs", "int", "Return {k} times the sum of xs.", "sum(xs) * {k}", k=tuple(range(2, 10))),
    _T("sum_minus", "xs", "int", "Return the sum of xs minus {t}.", "sum(xs) - {t}", t=tuple(range(1, 21))),
    _T("last_minus_first", "xs", "int", "Return the last element of xs minus the first.", "xs[-1] - xs[0]"),
    _T(
        "nth_default",
        "xs",
        "int",
        "Return xs[{k}], or {d} if xs is too short.",
        "xs[{k}] if len(xs) > {k} else {d}",
        k=(0, 1, 2, 3),
        d=(-1, 0, 99),
    ),
    # lists -> list
    _T("scale", "xs", "list", "Multiply each element of xs by {k}.", "[x * {k} for x in xs]", k=tuple(range(2, 10))),
    _T(
        "filter_map",
        "xs",
        "list",
        "Keep the elements of xs greater than {t}, each times {k}.",
        "[x * {k} for x in xs if x > {t}]",
        t=tuple(range(6)),
        k=(2, 3, 4, 5),
    ),
    _T(
        "dedupe",
        "xs",
        "list",
        "Remove repeated elements from xs, keeping first occurrences.",
        "list(dict.fromkeys(xs))",
    ),
    _T("running_sum", "xs", "list", "Return the running sums of xs.", "[sum(xs[:i + 1]) for i in range(len(xs))]"),
    _T(
        "mod_filter",
        "xs",
        "list",
        "Return the elements of xs divisible by {k}.",
        "[x for x in xs if x % {k} == 0]",
        k=(2, 3, 4, 5),
    ),
    _T(
        "clamp",
        "xs",
        "list",
        "Clamp each element of xs to the range {lo} to {hi}.",
        "[min(max(x, {lo}), {hi}) for x in xs]",
        lo=(0, 1, 2, 3),
        hi=(6, 7, 8, 9),
    ),
    _T(
        "mod_map", "xs", "list", "Return each element of xs modulo {k}.", "[x % {k} for x in xs]", k=tuple(range(3, 10))
    ),
    _T("running_max", "xs", "list", "Return the running maximum of xs.", "[max(xs[:i + 1]) for i in range(len(xs))]"),
    _T("first_k", "xs", "list", "Return the first {k} elements of xs.", "xs[:{k}]", k=(1, 2, 3, 4)),
)


def _make_projects(n_train: int = 12, n_test_only: int = 4) -> tuple[Project, ...]:
    """A fixed set of projects (independent of the domain seed).

    Train projects: every convention alone once, the rest input+output pairs;
    test-only projects: pairs no train project uses.  Few projects, so that a
    1,600-rollout run and a 1,000-task bank see each one often.  Ids are
    shuffled two-digit numbers and names pronounceable pseudo-words, so neither
    says anything about a project's conventions or its split.
    """
    rng = random.Random("code-v4:projects")
    singles = [(c,) for c in CONVENTIONS]
    pairs = [(p.name, w.name) for p in PRE_CONVENTIONS for w in WRAP_CONVENTIONS]
    rng.shuffle(pairs)
    train_sets = singles + pairs[: n_train - len(singles)]
    test_sets = pairs[len(pairs) - n_test_only :]
    ids = rng.sample(range(10, 100), n_train + n_test_only)
    names: list[str] = []
    while len(names) < n_train + n_test_only:
        w = _pseudo_word(rng)
        if w not in names:
            names.append(w)
    projects = [Project(f"p-{i}", convs, False, nm) for i, convs, nm in zip(ids, train_sets, names)]
    projects += [Project(f"p-{i}", convs, True, nm) for i, convs, nm in zip(ids[n_train:], test_sets, names[n_train:])]
    return tuple(sorted(projects, key=lambda p: p.id))


PROJECTS: tuple[Project, ...] = _make_projects()

#: first id of the warm-start projects (three digits; the train/test projects have two)
WARMSTART_PROJECT_BASE = 100


def warmstart_project(g: int) -> Project:
    """Warm-start project ``g``: a fresh convention set (one convention or an
    input+output pair, drawn like the train projects') under an id no train or
    test project has.  The warm start meets each such project in a handful of
    tasks only, so it cannot memorize project -> convention and must learn to
    read conventions from a context block (small-profile.md section 2)."""
    rng = random.Random(f"code-v2:warmstart-project:{g}")
    if rng.random() < 0.4:
        convs = (rng.choice(list(CONVENTIONS)),)
    else:
        convs = (rng.choice(PRE_CONVENTIONS).name, rng.choice(WRAP_CONVENTIONS).name)
    taken = {p.name for p in PROJECTS}
    name = _pseudo_word(rng)
    while name in taken:
        name = _pseudo_word(rng)
    return Project(f"p-{WARMSTART_PROJECT_BASE + g}", convs, False, name)


def render_reference(template: Template, params: dict, conventions: tuple[str, ...] = ()) -> str:
    """The canonical solution: ``def f(arg):`` plus 1-3 body lines.  ``conventions``
    are applied input side first, then output side, in ``CONVENTIONS`` order."""
    lines = [f"def f({template.arg}):"]
    expr = template.expr.format(**params)
    for conv in (CONVENTIONS[c] for c in CONVENTIONS if c in conventions):
        pre = dict(conv.pre).get(template.arg, "")
        lines += ["    " + line for line in pre.splitlines()]
        if conv.wrap:
            expr = conv.wrap.format(expr)
    lines.append(f"    return {expr}")
    return "\n".join(lines) + "\n"
