"""Base policies shipped in the repository (``results/base/<profile>/<domain>/``).

A base policy (the warm start every method and seed of a domain starts from) takes most of a
small pipeline's CPU time to train, so the repository may carry it.  A shipped base is used only
when it provably is what the configuration would build:

* ``manifest.json`` records the resolved job it was built from, its seed, the task domain's
  version and the SHA-256 of every file (``model/*`` and ``eval.json``);
* the ``warmstart`` rule installs it only if the settings its weights depend on (:func:`defining`),
  its seed and the domain version equal the current ones (:func:`matches`), and the install
  re-hashes every file (:func:`install`); otherwise the pipeline trains the base policy as usual;
* its evaluation follows the configuration: where the evaluation settings differ from those it
  was shipped with (:func:`evaluation_differs`), the install evaluates it again (``methods.cli
  install-base``), exactly as a build with those settings would;
* the ``base_rebuild`` rule trains it again from scratch and compares file by file
  (:func:`compare`): the model files must be bit-identical on the same software versions.

This module imports neither torch nor transformers: the Snakefile calls :func:`matches` while it
builds the DAG.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
SHIPPED_ROOT = Path("results") / "base"
# eval.json holds wall times and provenance: its scores are compared, not its bytes
EVAL_SCORES = ("heldout_reward", "heldout_success", "heldout_turns", "stage1_heldout_reward")
# a profile's name is not a setting: the same settings under another name build the same policy
NOT_DEFINING = ("profile",)
# The training settings a base policy's weights depend on: its on-policy stage samples the
# policy's own attempts with them.  The runs' other settings (budget, learning rate, evaluation
# sizes, ...) do not touch the base policy, so a shipped one fits any of them.
BASE_TRAIN_SETTINGS = ("temperature", "max_new_tokens", "max_seq_len")
# What the base policy's evaluation (eval.json: held-out and training-split scores) depends on.
EVAL_SETTINGS = ("eval_episodes", "eval_temperature", "max_new_tokens", "max_seq_len")


def defining(job: dict[str, Any]) -> dict[str, Any]:
    """The settings a base policy's weights depend on: its job without the profile's name, and of
    the training settings only :data:`BASE_TRAIN_SETTINGS`."""
    out = {k: v for k, v in job.items() if k not in NOT_DEFINING}
    if isinstance(out.get("train"), dict):
        out["train"] = {k: out["train"][k] for k in BASE_TRAIN_SETTINGS if k in out["train"]}
    return out


def evaluation_differs(shipped_job: dict[str, Any], job: dict[str, Any]) -> list[str]:
    """The evaluation settings in which ``job`` differs from the job a base was shipped with."""
    a, b = shipped_job.get("train") or {}, job.get("train") or {}
    return [f"train.{k}" for k in EVAL_SETTINGS if a.get(k) != b.get(k)]


def shipped_dir(profile: str, domain: str, root: Path | str = ".") -> Path:
    return Path(root) / SHIPPED_ROOT / profile / domain


def sha256_file(path: Path) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_hashes(src: Path) -> dict[str, str]:
    """SHA-256 of ``eval.json`` and every file under ``model/``, by path relative to ``src``."""
    src = Path(src)
    files = [src / "eval.json", *sorted(p for p in (src / "model").rglob("*") if p.is_file())]
    return {p.relative_to(src).as_posix(): sha256_file(p) for p in files}


def _scores(src: Path) -> dict[str, Any]:
    ev = json.loads((Path(src) / "eval.json").read_text())
    return {k: ev[k] for k in EVAL_SCORES if k in ev}


def read_manifest(path: Path) -> dict[str, Any] | None:
    path = Path(path)
    if not (path / MANIFEST).is_file():
        return None
    return json.loads((path / MANIFEST).read_text())


def mismatch(manifest: dict[str, Any], job: dict[str, Any], seed: int, domain_version: str) -> str | None:
    """Why a shipped base is not the one this job would build (None if it is)."""
    if manifest.get("seed") != seed:
        return f"seed {manifest.get('seed')} (wanted {seed})"
    if manifest.get("domain_version") != domain_version:
        return f"domain version {manifest.get('domain_version')} (tasks are now {domain_version})"
    shipped, job = defining(manifest.get("job") or {}), defining(job)
    differ = sorted(k for k in set(shipped) | set(job) if shipped.get(k) != job.get(k))
    if differ:
        detail = []
        for k in differ:
            a, b = shipped.get(k), job.get(k)
            if isinstance(a, dict) and isinstance(b, dict):
                detail += [f"{k}.{s}" for s in sorted(set(a) | set(b)) if a.get(s) != b.get(s)]
            else:
                detail.append(k)
        return "settings " + ", ".join(detail)
    return None


def matches(
    profile: str, domain: str, job: dict[str, Any], seed: int, domain_version: str, root: Path | str = "."
) -> tuple[Path | None, str | None]:
    """(shipped directory, None) if a shipped base fits this job; (None, reason) if one exists but
    does not fit; (None, None) if none is shipped."""
    path = shipped_dir(profile, domain, root)
    manifest = read_manifest(path)
    if manifest is None:
        return None, None
    why = mismatch(manifest, job, seed, domain_version)
    return (None, why) if why else (path, None)


def ship(
    src: Path, dst: Path, job: dict[str, Any], seed: int, domain_version: str, provenance: dict[str, Any]
) -> dict[str, Any]:
    """Copy a built base policy (``model/``, ``eval.json``) to ``dst`` and write its manifest."""
    src, dst = Path(src), Path(dst)
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copytree(src / "model", tmp / "model")
    shutil.copy2(src / "eval.json", tmp / "eval.json")
    manifest = {
        "seed": seed,
        "domain_version": domain_version,
        "job": job,
        "files": file_hashes(tmp),
        "scores": _scores(src),
        "built_by": provenance,
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)
    return manifest


def verify(path: Path) -> list[str]:
    """Files of a shipped base whose bytes differ from its manifest (missing or extra ones too)."""
    path = Path(path)
    manifest = read_manifest(path)
    if manifest is None:
        return [MANIFEST]
    have, want = file_hashes(path), manifest["files"]
    return sorted(k for k in set(have) | set(want) if have.get(k) != want.get(k))


def install(path: Path, out: Path, job: dict[str, Any], seed: int, domain_version: str) -> dict[str, Any]:
    """Copy a shipped base to a warm-start directory after checking its settings and every byte."""
    path, out = Path(path), Path(out)
    manifest = read_manifest(path)
    if manifest is None:
        raise ValueError(f"{path} holds no {MANIFEST}")
    why = mismatch(manifest, job, seed, domain_version)
    if why:
        raise ValueError(f"the shipped base policy {path} was built with other {why}")
    bad = verify(path)
    if bad:
        raise ValueError(
            f"the shipped base policy {path} does not match its manifest: {', '.join(bad)} (rebuild it: see README)"
        )
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "model.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(path / "model", tmp)
    shutil.rmtree(out / "model", ignore_errors=True)
    tmp.rename(out / "model")
    shutil.copy2(path / "eval.json", out / "eval.json.tmp")
    (out / "eval.json.tmp").replace(out / "eval.json")
    return manifest


def compare(rebuilt: Path, shipped: Path) -> dict[str, Any]:
    """A rebuilt base policy against the shipped one: which files differ and the scores of each."""
    rebuilt, shipped = Path(rebuilt), Path(shipped)
    manifest = read_manifest(shipped) or {"files": {}, "scores": {}}
    have = file_hashes(rebuilt)
    model_files = sorted(k for k in set(have) | set(manifest["files"]) if k.startswith("model/"))
    differ = [k for k in model_files if have.get(k) != manifest["files"].get(k)]
    scores = _scores(rebuilt)
    return {
        "shipped": str(shipped),
        "rebuilt": str(rebuilt),
        "model_files": model_files,
        "model_files_differ": differ,
        "bit_identical": not differ and bool(model_files),
        "scores_rebuilt": scores,
        "scores_shipped": manifest.get("scores", {}),
        "scores_equal": scores == manifest.get("scores", {}),
    }
