"""BFCL multi-turn (Berkeley Function-Calling Leaderboard v4, ``multi_turn_base``) as an evaluation-only task domain.

The 200 conversations, their gold answers, the function documentation and the executable API simulators
(a file system, a trading bot, a travel agency, ...) come from the ``bfcl-eval`` wheel; nothing is
downloaded.  Like ``tasks/humaneval.py`` the domain has one split, ``test``.

**Call format.**  The student sees the functions of the conversation's API classes as Python signatures
(all of them, as BFCL's own prompt lists them: BFCL's code never reads the entries' ``excluded_function``)
and the first user request.  It calls functions with Python-style calls, one per line, with literal
arguments (``cd(folder='document')``), best inside a ```python block; BFCL's own list form
``[cd(folder='a'), ls()]`` works too.  Without a ```python block, every line that begins with
``name(`` is taken as a call and other lines as prose.  Calls are parsed with :mod:`ast` and their
arguments read with :func:`ast.literal_eval`: model text is never evaluated.  A message with calls runs
them against the episode's own simulator instances and the results are the observation; a message
without calls ends the user turn and the next request is the observation (the last one ends the
episode).  A message that does not parse, names an unknown function or passes a non-literal
argument runs nothing and gets an error observation; unlike BFCL's harness, which ends the user turn
on an undecodable reply, the student may try again (``max_turns`` bounds the episode).

**Scoring** is BFCL's own ``multi_turn_checker`` (per user turn: the simulators' state after the
student's calls must equal the state after the gold calls, and the gold calls' results must be among
the student's), fed the calls recorded per user turn and per message in the form BFCL's evaluation
decodes them (canonical ``name(arg=value)`` strings).  The checker re-executes those strings with
``eval``; they are rebuilt from validated literals, so no model text reaches it.  An episode that ends
before the last user turn is "force-terminated", as in BFCL's evaluation runner: reward 0.

**No stub is needed.**  BFCL's model registry (``bfcl_eval.constants.model_config``) imports every LLM
SDK, but in bfcl-eval 2026.3.23 the multi-turn checker, its executor and the simulators used here import
only ``bfcl_eval.constants.executable_backend_config`` and ``mpmath``, so this module imports nothing of
the registry (``tests/test_bfcl.py`` checks it).

**Execution.**  Episodes build their own simulator instances the way BFCL's ``execute_multi_turn_func_call``
does, but do not call it: it runs call strings with ``eval`` and caches instances in its module's globals.
The simulators are plain in-memory Python: no files, no network, and one clock reading (TravelAPI's
``verify_traveler_information`` computes an age from today's date, which matters only for birth dates
about 18 years back; the gold travelers were born in 1995 or earlier).  Each instance keeps its own
state (``_load_scenario`` deep-copies the defaults, random generators are seeded from the scenario).
Two things are global: ``MathAPI`` sets process-wide precision
(``mpmath.mp.dps``, the thread's ``decimal`` context), which :func:`_numeric_globals_restored` puts back
after every execution, and computes with arbitrary precision, which ``_ARGUMENT_LIMITS`` bounds; and
BFCL's executor caches instances by model name and entry id, so :func:`run_checker` uses a fresh model
name per run and removes its instances afterwards.
"""

from __future__ import annotations

import ast
import copy
import decimal
import importlib
import inspect
import itertools
import json
import re
import textwrap
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from importlib.metadata import version as installed_version
from importlib.resources import files
from typing import Any

from tasks.base import BenchmarkDomain, Episode, StepResult, Task, Turn, register_domain

__all__ = ["BFCLMultiTurnDomain", "CallFormatError", "load_entries", "parse_calls", "render_functions", "run_checker"]

BFCL_VERSION = "2026.3.23"
CATEGORY = "multi_turn_base"

#: assistant messages allowed per user turn (the expert needs two: the calls, then "Done.")
_MESSAGES_PER_USER_TURN = 5
#: size limits on one message's calls and on one result shown back
_MAX_CODE_CHARS = 20_000
_MAX_CALLS_PER_MESSAGE = 20
_MAX_RESULT_CHARS = 2_000
#: MathAPI computes with arbitrary precision: these bound the work one call may ask for (BFCL's gold
#: answers use precision 10 at most); larger values are refused before anything runs.
_ARGUMENT_LIMITS = {
    ("power", "exponent"): 10_000,
    ("logarithm", "precision"): 1_000,
    ("square_root", "precision"): 1_000,
}

_INSTRUCTION = """You help a user by calling the functions listed below. To call functions, reply with the calls \
in a ```python block, one call per line, with literal argument values (strings, numbers, True/False/None, lists, \
dicts), for example:
```python
cd(folder='document')
ls(a=True)
```
The results come back in the next message, and you may call more functions. When the user's request is done, \
or needs no call, reply in plain text without any call; then the user's next request follows."""
_FORMAT_HINT = "Write calls as name(arg=value), one per line in a ```python block."
_EXPERT_DONE = "Done."

_PYTHON_BLOCK = re.compile(r"```[ \t]*(?:python|py)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
_CALL_LINE = re.compile(r"^\s*\[?\s*[A-Za-z_][\w.]*\(")
_TYPES = {"string": "str", "integer": "int", "float": "float", "boolean": "bool", "array": "list", "dict": "dict"}


# --------------------------------------------------------------------------- BFCL's data
def _data_file(*parts: str):
    return files("bfcl_eval").joinpath("data", *parts)


def _read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@cache
def load_entries() -> tuple[tuple[dict, list[list[str]]], ...]:
    """(entry, gold calls per user turn) for the 200 ``multi_turn_base`` conversations, in BFCL's order."""
    from importlib.metadata import PackageNotFoundError

    install = f"pip install --no-deps bfcl-eval=={BFCL_VERSION} (its own dependencies are every LLM SDK)"
    try:
        found = installed_version("bfcl-eval")
    except PackageNotFoundError:
        raise ModuleNotFoundError(f"the bfcl_multiturn domain needs BFCL's data and simulators: {install}") from None
    if found != BFCL_VERSION:
        raise RuntimeError(f"bfcl_multiturn is built on bfcl-eval=={BFCL_VERSION}, found {found}")
    entries = _read_jsonl(_data_file(f"BFCL_v4_{CATEGORY}.json"))
    gold = {a["id"]: a["ground_truth"] for a in _read_jsonl(_data_file("possible_answer", f"BFCL_v4_{CATEGORY}.json"))}
    return tuple((entry, gold[entry["id"]]) for entry in entries)


@cache
def function_docs(class_name: str) -> tuple[dict, ...]:
    """BFCL's documentation of one API class's functions (``data/multi_turn_func_doc``)."""
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    return tuple(_read_jsonl(_data_file("multi_turn_func_doc", MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name])))


def render_functions(class_names: Sequence[str]) -> str:
    """The functions of ``class_names`` as compact Python signatures, each with its descriptions."""
    return "\n\n".join(_render_class(name) for name in class_names)


def _render_class(class_name: str) -> str:
    docs = function_docs(class_name)
    about = docs[0]["description"].partition("Tool description:")[0].strip()
    return "\n".join([f"# {class_name}: {about}", *(_render_function(doc) for doc in docs)])


def _render_function(doc: dict) -> str:
    properties = doc["parameters"]["properties"]
    required = set(doc["parameters"].get("required", []))
    signature = ", ".join(_render_parameter(name, spec, name in required) for name, spec in properties.items())
    description = doc["description"].rpartition("Tool description:")[2].strip()
    lines = [f"{doc['name']}({signature})", f"    {description}"]
    lines += [f"    {name}: {_parameter_description(spec)}" for name, spec in properties.items()]
    return "\n".join(lines)


def _render_parameter(name: str, spec: dict, required: bool) -> str:
    kind = _TYPES.get(spec["type"], spec["type"])
    if "items" in spec:
        kind += f"[{_TYPES.get(spec['items']['type'], spec['items']['type'])}]"
    if required:
        return f"{name}: {kind}"
    default = None if spec.get("default") == "None" else spec.get("default")  # BFCL writes None as 'None'
    return f"{name}: {kind} = {default!r}"


def _parameter_description(spec: dict) -> str:
    text = spec.get("description", "").strip()
    if "properties" in spec:
        keys = ", ".join(f"{k} ({_TYPES.get(v['type'], v['type'])})" for k, v in spec["properties"].items())
        text += f" Keys: {keys}."
    return text


def _readable(gold_call: str) -> str:
    """A gold call with uniform spacing (BFCL's are written by hand)."""
    return ast.unparse(ast.parse(gold_call, mode="eval"))


def _user_text(question_turn: list[dict]) -> str:
    return "\n".join(message["content"] for message in question_turn)


# --------------------------------------------------------------------------- the call format
class CallFormatError(ValueError):
    """A message whose calls cannot be run: its text is the error observation."""


@dataclass(frozen=True)
class Call:
    """One validated call: a known function and literal arguments."""

    name: str
    args: tuple
    kwargs: tuple[tuple[str, Any], ...]

    def __str__(self) -> str:
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs]
        return f"{self.name}({', '.join(parts)})"


def parse_calls(text: str, functions: Mapping[str, Callable]) -> list[Call]:
    """The calls in one assistant message; ``[]`` for plain text.  Raises :class:`CallFormatError`
    when a call does not parse, names no function of ``functions`` or has a non-literal argument."""
    regions = _code_regions(text)
    if sum(len(r) for r in regions) > _MAX_CODE_CHARS:
        raise CallFormatError(f"the calls are longer than {_MAX_CODE_CHARS} characters")
    calls = [_validated(node, source, functions) for source in regions for node in _call_nodes(source)]
    if len(calls) > _MAX_CALLS_PER_MESSAGE:
        raise CallFormatError(f"{len(calls)} calls in one message; at most {_MAX_CALLS_PER_MESSAGE} are allowed")
    return calls


def _code_regions(text: str) -> list[str]:
    """The ```python blocks, or else each line that begins with ``name(``."""
    blocks = _PYTHON_BLOCK.findall(text)
    if blocks:
        return [textwrap.dedent(block) for block in blocks]
    return [line.strip() for line in text.splitlines() if _CALL_LINE.match(line)]


def _call_nodes(source: str) -> list[ast.Call]:
    try:
        module = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise CallFormatError(f"could not parse {_clip(source, 200)!r} ({getattr(e, 'msg', e)})") from None
    nodes = []
    for statement in module.body:
        value = statement.value if isinstance(statement, ast.Expr) else statement
        items = value.elts if isinstance(value, ast.List | ast.Tuple) else [value]
        if not all(isinstance(item, ast.Call) for item in items):
            segment = ast.get_source_segment(source, statement) or ""
            raise CallFormatError(f"only function calls are allowed, not {_clip(segment, 200)!r}")
        nodes.extend(items)
    return nodes


def _validated(node: ast.Call, source: str, functions: Mapping[str, Callable]) -> Call:
    segment = _clip(ast.get_source_segment(source, node) or "", 200)
    if not isinstance(node.func, ast.Name):
        raise CallFormatError(f"call the listed functions by their bare name, not {segment!r}")
    if node.func.id not in functions:
        raise CallFormatError(f"unknown function {node.func.id!r}")
    if any(keyword.arg is None for keyword in node.keywords):
        raise CallFormatError(f"write every argument out in {segment!r}")
    call = Call(
        node.func.id,
        tuple(_literal(arg, segment) for arg in node.args),
        tuple((keyword.arg, _literal(keyword.value, segment)) for keyword in node.keywords),
    )
    _check_limits(call, functions[call.name])
    return call


def _literal(node: ast.expr, segment: str) -> Any:
    """The value of a literal argument, if its repr reads back (the checker re-executes that repr)."""
    try:
        value = ast.literal_eval(node)
        ast.literal_eval(repr(value))
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        raise CallFormatError(
            f"argument values must be literals (strings, numbers, lists, ...) in {segment!r}"
        ) from None
    return value


def _check_limits(call: Call, function: Callable) -> None:
    try:
        arguments = inspect.signature(function).bind(*call.args, **dict(call.kwargs)).arguments
    except TypeError:
        return  # the call itself fails with this TypeError, before any work
    for (name, parameter), limit in _ARGUMENT_LIMITS.items():
        value = arguments.get(parameter)
        if name == call.name and isinstance(value, int | float) and abs(value) > limit:
            raise CallFormatError(f"{parameter}={value!r} of {name} is over this environment's limit {limit}")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... [{len(text) - limit} more characters]"


# --------------------------------------------------------------------------- execution
def _api_class(class_name: str) -> type:
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    return getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)


def _simulators(entry: dict) -> dict[str, Callable]:
    """Fresh simulator instances loaded with the entry's scenario, as BFCL's
    ``execute_multi_turn_func_call`` makes them: {public method name: bound method}."""
    from bfcl_eval.constants.executable_backend_config import STATELESS_CLASSES

    functions = {}
    for class_name in entry["involved_classes"]:
        instance = _api_class(class_name)()
        if class_name not in STATELESS_CLASSES:
            instance._load_scenario(copy.deepcopy(entry["initial_config"].get(class_name, {})), long_context=False)
        functions.update(
            (name, method)
            for name, method in inspect.getmembers(instance, inspect.ismethod)
            if not name.startswith("_")
        )
    return functions


@contextmanager
def _numeric_globals_restored() -> Iterator[None]:
    """Undo MathAPI's process-wide precision settings (``mpmath.mp.dps``, the ``decimal`` context)."""
    import mpmath

    dps = mpmath.mp.dps
    try:
        with decimal.localcontext():
            yield
    finally:
        mpmath.mp.dps = dps


def _execute(call: Call, functions: Mapping[str, Callable]) -> str:
    """Run one validated call; the result as text, formatted as BFCL's executor formats it."""
    try:
        with _numeric_globals_restored():  # the result is formatted at the precision the call set
            return _format_result(functions[call.name](*copy.deepcopy(call.args), **copy.deepcopy(dict(call.kwargs))))
    except Exception as e:  # BFCL reports any simulator exception as the call's result
        return f"Error during execution: {e}"


def _format_result(result: Any) -> str:
    if isinstance(result, str):
        return result
    if isinstance(result, dict):
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


_checker_runs = itertools.count()


def run_checker(decoded: list[list[list[str]]], gold: list[list[str]], entry: dict) -> dict:
    """BFCL's ``multi_turn_checker`` on one conversation: ``{"valid": bool, "error_type", "error_message"}``.

    ``decoded`` holds, per user turn, per assistant message, the calls as canonical strings.  BFCL's
    executor caches instances in its module's globals under ``{model_name}_...``: a fresh model name
    per run keeps runs apart, and its instances are removed afterwards."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    model_name = f"lopd_bench_{next(_checker_runs)}"
    try:
        with _numeric_globals_restored():
            result = multi_turn_checker(decoded, gold, entry, CATEGORY, model_name)
    finally:
        registry = vars(multi_turn_utils)
        for key in [k for k in registry if k.startswith(model_name + "_")]:
            del registry[key]
    return {k: result[k] for k in ("valid", "error_type", "error_message") if k in result}


# --------------------------------------------------------------------------- episodes
class BFCLEpisode(Episode):
    """One conversation: user turns, each answered by messages of calls and closed by a message without."""

    def __init__(self, task: Task):
        super().__init__(task)
        self._entry = task.payload["entry"]
        self._gold = task.payload["ground_truth"]
        self._functions = _simulators(self._entry)
        self._turn = 0  # the current user turn
        self.decoded: list[list[list[str]]] = [[]]  # per user turn reached, per message: the calls run
        self._calls = 0
        self._format_errors = 0
        self._verdict: dict | None = None

    def step(self, action: str) -> StepResult:
        if self.done:
            return StepResult(None, True)
        try:
            calls = parse_calls(action, self._functions)
        except CallFormatError as e:
            self._format_errors += 1
            observation = f"Error: {e}. Nothing was run. {_FORMAT_HINT}"
        else:
            observation = self._run(calls) if calls else self._next_user_turn()
        self.turns.append(Turn(action, observation))
        if len(self.turns) >= self.task.max_turns:
            self.done = True
        return StepResult(observation, self.done)

    def _run(self, calls: list[Call]) -> str:
        self.decoded[self._turn].append([str(call) for call in calls])
        self._calls += len(calls)
        return "\n".join(
            f"{_clip(str(call), 200)} -> {_clip(_execute(call, self._functions), _MAX_RESULT_CHARS)}" for call in calls
        )

    def _next_user_turn(self) -> str | None:
        self._turn += 1
        if self._turn == len(self._gold):
            self.done = True
            return None
        self.decoded.append([])
        return _user_text(self._entry["question"][self._turn])

    def verdict(self) -> dict:
        """BFCL's verdict on the calls so far (kept once the episode is done)."""
        if self._verdict is not None:
            return self._verdict
        if len(self.decoded) < len(self._gold):
            verdict = {
                "valid": False,
                "error_type": "multi_turn:force_terminated",
                "error_message": f"the episode ended in user turn {len(self.decoded)} of {len(self._gold)}",
            }
        else:
            verdict = run_checker(self.decoded, self._gold, self._entry)
        if self.done:
            self._verdict = verdict
        return verdict

    def reward(self) -> float:
        return 1.0 if self.verdict()["valid"] else 0.0

    def feedback(self) -> str:
        verdict = self.verdict()
        return "" if verdict["valid"] else f"{verdict['error_type']}: {verdict['error_message']}"

    def expert_action(self) -> str:
        """The current user turn's gold calls not yet run, in one message; once all ran, "Done."."""
        if self.done:
            return _EXPERT_DONE
        ran = Counter(call for message in self.decoded[self._turn] for call in message)
        remaining = []
        for text in self._gold[self._turn]:
            call = str(parse_calls(text, self._functions)[0])
            if ran[call]:
                ran[call] -= 1
            else:
                remaining.append(call)
        return "```python\n" + "\n".join(remaining) + "\n```" if remaining else _EXPERT_DONE

    def info(self) -> dict[str, Any]:
        return {
            "user_turns_reached": len(self.decoded),
            "user_turns": len(self._gold),
            "calls": self._calls,
            "format_errors": self._format_errors,
        }


@register_domain
class BFCLMultiTurnDomain(BenchmarkDomain):
    """BFCL v4's 200 ``multi_turn_base`` conversations, evaluation only, scored by BFCL's own checker."""

    name = "bfcl_multiturn"
    version = f"bfcl-eval-{BFCL_VERSION}-{CATEGORY}-v1"
    system_prompt = ""  # a real model's chat template brings its own

    def load_tasks(self) -> list[Task]:
        return [self._task(entry, gold) for entry, gold in load_entries()]

    def _task(self, entry: dict, gold: list[list[str]]) -> Task:
        prompt = (
            f"{_INSTRUCTION}\n\nFunctions:\n{render_functions(entry['involved_classes'])}\n\n"
            f"User request:\n{_user_text(entry['question'][0])}"
        )
        reference = "\n".join(
            f"turn {k + 1}: {'; '.join(map(_readable, calls)) if calls else '(no call)'}"
            for k, calls in enumerate(gold)
        )
        return Task(
            task_id=entry["id"],
            domain=self.name,
            split="test",
            template_id=entry["id"],
            group_id="+".join(sorted(entry["involved_classes"])),
            prompt=prompt,
            reference=reference,
            max_turns=_MESSAGES_PER_USER_TURN * len(gold),
            payload={"entry": entry, "ground_truth": gold},
        )

    def reset(self, task: Task) -> BFCLEpisode:
        return BFCLEpisode(task)
