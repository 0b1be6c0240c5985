"""What the stages' commands share: reading a job, the held-out benchmark a job names, writing a
warm start whole, and telling whether a stored evaluation of the base policy fits a job."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def read_job(text: str) -> dict:
    if text.startswith("@"):
        text = Path(text[1:]).read_text()
    return json.loads(text)


def heldout_domain(job: dict):
    """The evaluation-only benchmark a job's held-out evaluations use (``heldout_domain``), or None
    when they use the training domain's own test split."""
    from tasks.base import get_domain

    return get_domain(job["heldout_domain"]) if job.get("heldout_domain") else None


def save_warm_start(out: Path, model, tokenizer, report: dict) -> None:
    """model/ then eval.json (the rule's output), each replaced whole."""
    from methods.core.policy import save_policy
    from methods.core.provenance import write_json_atomic

    tmp = out / "model.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save_policy(model, tokenizer, tmp)
    shutil.rmtree(out / "model", ignore_errors=True)
    tmp.rename(out / "model")
    write_json_atomic(out / "eval.json", report)


def domain_version(job: dict) -> str:
    from tasks.base import get_domain

    domain = get_domain(job["domain"], seed=job["task_seed"], **job["domain_options"])
    version = domain.version
    domain.close()
    return version


EVAL_DEFINING = (
    "eval_episodes",
    "eval_temperature",
    "max_new_tokens",
    "max_seq_len",
)  # what a held-out evaluation depends on besides the model


def base_eval_of(path: Path, job: dict, version: str) -> dict | None:
    """An evaluation of the base policy (its own ``eval.json``, or a ``retrieved-eval`` file) when it
    was made on this job's held-out tasks with this job's evaluation settings, else None (the loop
    then evaluates)."""
    if not path.exists():
        return None
    base = json.loads(path.read_text())
    bjob = base.get("job") or {}
    same = (
        base.get("domain_version") == version
        and all(bjob.get(k) == job.get(k) for k in ("domain", "task_seed", "domain_options", "heldout_domain"))
        and all((bjob.get("train") or {}).get(k) == job["train"].get(k) for k in EVAL_DEFINING)
    )
    return base if same else None
