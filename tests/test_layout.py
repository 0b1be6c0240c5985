"""The shared core knows no method: nothing under ``methods/core/`` or ``methods/stages/``, and not ``methods/cli.py``,
imports a method module or names a field that only a method's own config has.  Methods declare
what they need (``uses_bank``, ``needs_cold_start``, ``cold_start_fields``) and the core reads
the declarations."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from methods.core import registry

ROOT = Path(__file__).resolve().parents[1]
CORE_FILES = (
    sorted((ROOT / "methods" / "core").glob("*.py"))
    + sorted((ROOT / "methods" / "stages").glob("*.py"))
    + [ROOT / "methods" / "cli.py"]
)


def _imported_modules(path: Path) -> set[str]:
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)] if node.level else []
            mod = ".".join([*base, node.module] if node.module else base)
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in node.names}
    return out


def _string_constants(path: Path) -> set[str]:
    return {
        n.value
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def test_the_core_imports_no_method_module():
    method_packages = {".".join(m.split(".")[:2]) for m in registry.method_modules()}
    assert {"methods.grpo", "methods.lopd"} <= method_packages
    for path in CORE_FILES:
        bad = {m for m in _imported_modules(path) if any(m == p or m.startswith(p + ".") for p in method_packages)}
        assert not bad, f"{path.relative_to(ROOT)} imports method modules {sorted(bad)}"


def _code_of_rule_file(text: str) -> str:
    """A Snakemake file without its comments and its docstrings (what runs, not what documents)."""
    import re

    text = re.sub(r'"""(.|\n)*?"""', "", text)
    return "\n".join(line.split("#", 1)[0] for line in text.splitlines())


def test_no_rule_file_names_a_method():
    """The rules ask the configuration (``focus_method``, ``reference_method``) and the methods'
    declarations (``uses_bank``, cold starts) instead of naming methods, so a method is one module
    plus one config line for the pipeline too."""
    import re

    names = set(registry.known_methods())
    assert {"grpo", "lopd", "retrieval_rl"} <= names
    pattern = re.compile(r"\b(" + "|".join(sorted(names)) + r")\b")
    for path in [ROOT / "Snakefile", *sorted((ROOT / "rules").glob("*.smk"))]:
        hits = sorted(set(pattern.findall(_code_of_rule_file(path.read_text()))))
        assert not hits, f"{path.relative_to(ROOT)} names the methods {hits}"
    assert pattern.findall(_code_of_rule_file('x = job_of(d, "retrieval_rl")  # retrieval RL')) == ["retrieval_rl"]


def test_the_core_names_no_methods_own_counter():
    """A method's own token-pass counters (LOPD's composer) are its declaration, not the ledger's."""
    import re

    own = {c for name in registry.known_methods() for c in registry.get_method(name).pass_counters}
    assert {"composer_fwd_tokens", "composer_bwd_tokens"} <= own
    for path in CORE_FILES:
        hits = {c for c in own if re.search(rf"\b{c}\b", path.read_text())}
        assert not hits, f"{path.relative_to(ROOT)} names {sorted(hits)}"


def test_the_kernel_imports_no_stage():
    """The training kernel (``methods/core/``) runs without the pipeline's stages (``methods/stages/``):
    the arrow goes from the stages to the kernel only."""
    for path in sorted((ROOT / "methods" / "core").glob("*.py")):
        bad = {m for m in _imported_modules(path) if m.startswith("methods.stages") or m.startswith("methods.cli")}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_the_core_imports_no_verl_backend():
    """The training kernel runs without verl: nothing under ``methods/core/`` imports the backend."""
    for path in sorted((ROOT / "methods" / "core").glob("*.py")):
        bad = {m for m in _imported_modules(path) if m.startswith("methods.verl_backend")}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_the_core_names_no_field_of_a_methods_own_config():
    shared = set()
    for path in CORE_FILES:  # the core's own config classes (MethodConfig, DistillConfig, ...)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                shared.add(node.target.id)
    own = set()
    for name in registry.known_methods():
        own |= {f.name for f in dataclasses.fields(registry.get_method(name).Config)} - shared
    assert "cold_start_steps" in own  # LOPD's, say
    for path in CORE_FILES:
        named = own & _string_constants(path)
        assert not named, f"{path.relative_to(ROOT)} names fields of a method's own config: {sorted(named)}"


@pytest.mark.parametrize(
    "check",
    [
        ["ruff", "check", "."],
        ["ruff", "format", "--check", "."],
        ["snakefmt", "--check", "Snakefile", "rules"],
        ["mypy"],  # the files and settings are pyproject.toml's [tool.mypy]
    ],
    ids=lambda c: " ".join(c[:2]),
)
def test_the_house_rules_hold(check):
    """The house rules check themselves in the quick loop too, not only in CI (.ci/run)."""
    import shutil
    import subprocess

    if shutil.which(check[0]) is None:
        pytest.skip(f"{check[0]} is not installed (the test extra pins it)")
    out = subprocess.run(check, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
