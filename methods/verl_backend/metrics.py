"""A finished verl run as the suite's run files (``metrics.jsonl``, ``summary.json``), so that
``analysis/`` reads it as it reads the suite's own runs and refuses the same mismatches.

A verl run leaves two records this adapter reads:

* verl's file logger (``trainer.logger`` includes ``file``; ``VERL_FILE_LOGGER_PATH``): one JSON
  line per training step, ``{"step": s, "data": {metric: value}}`` with verl's names
  (``critic/score/mean``, ``actor/pg_loss``, ``actor/grad_norm``, ``response_length/mean``,
  ``timing_s/step``);
* verl's validation dumps (``trainer.validation_data_dir``): ``<step>.jsonl`` per validation, one
  line per held-out episode with its ``score``.  The suite's held-out metrics are per-episode means
  with their standard error, so they are computed from these lines, not from verl's aggregates.

A step's rollouts are the job's ``train.rollouts_per_step`` (the generated config makes
``data.train_batch_size`` x ``rollout.n`` equal to it), so the ledger is exact.  A run whose last
validation is not at the budget is refused: Table 1 compares methods at one budget.
"""

from __future__ import annotations

import json
from pathlib import Path

from methods.core.evaluate import mean_se
from methods.core.provenance import provenance, write_json_atomic, write_text_atomic

__all__ = ["validation_records", "train_records", "write_run_files"]

#: the suite's train-record field <- verl's metric name
TRAIN_FIELDS = {
    "train_reward": "critic/score/mean",
    "loss": "actor/pg_loss",
    "grad_norm": "actor/grad_norm",
    "train_gen_tokens": "response_length/mean",
    "approx_kl": "actor/ppo_kl",
    "clipfrac": "actor/pg_clipfrac",
}  # and each method's own (its adapter's run_file_fields: methods/verl_backend/adapters.py)
#: the sampled reverse KL's metrics (methods/verl_backend/plugin.py), each a sum over the step's
#: tokens, so that their ratios are token means however verl splits the step
KL_SUM, TAUGHT_TOKENS, RESPONSE_TOKENS = (
    "distillation/sampled_reverse_kl_sum",
    "distillation/taught_tokens",
    "distillation/response_tokens",
)
#: the suite's train-record field <- the ratio of two of those (verl prefixes the actor's names with actor/)
RATIO_FIELDS = {
    "sdl_kl": ("actor/" + KL_SUM, "actor/" + TAUGHT_TOKENS),
    "taught_token_share": ("actor/" + TAUGHT_TOKENS, "actor/" + RESPONSE_TOKENS),
}


def _lines(path: Path) -> list[dict]:
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not a JSON line ({e.msg})") from None
    return out


def validation_records(val_dir: str | Path, rollouts_per_step: int) -> list[dict]:
    """One suite eval record per verl validation dump (``<step>.jsonl``), in step order."""
    files = sorted(Path(val_dir).glob("*.jsonl"), key=lambda p: int(p.stem) if p.stem.isdigit() else -1)
    records = []
    for f in files:
        if not f.stem.isdigit():
            raise ValueError(f"{f}: a validation dump is named <step>.jsonl")
        scores = [float(row["score"]) for row in _lines(f)]
        if not scores:
            raise ValueError(f"{f}: an empty validation")
        mean, se = mean_se(scores)
        step = int(f.stem)
        records.append(
            {
                "kind": "eval",
                "step": step,
                "rollouts": step * rollouts_per_step,
                "heldout_reward": mean,
                "heldout_reward_se": se,
                "heldout_success": sum(s >= 1.0 for s in scores) / len(scores),
                "heldout_episodes": len(scores),
            }
        )
    return records


def _logs(verl_log) -> list[Path]:
    """One path or several, in the order they were written: verl's ``FileLogger`` opens its file
    with ``"wb"``, so each attempt of a run (a resume after a crash) logs to a file of its own
    (``rules/verl.smk``: ``verl.<start time>.jsonl``)."""
    paths = [verl_log] if isinstance(verl_log, (str, Path)) else list(verl_log)
    return sorted(Path(p) for p in paths)


def train_records(verl_log, rollouts_per_step: int, fields: dict[str, str] | None = None) -> list[dict]:
    """One suite train record per step verl logged, over every attempt's log (``verl_log``: one
    path or several; the last line of a step wins: a resumed run logs its step again).  ``fields``
    are the method's own (suite field <- verl metric), beside :data:`TRAIN_FIELDS`."""
    fields = {**TRAIN_FIELDS, **(fields or {})}
    by_step: dict[int, dict] = {}
    for line in (line for path in _logs(verl_log) for line in _lines(path)):
        data = line.get("data", {})
        if not any(k in data for k in fields.values()):
            continue  # a validation-only line
        by_step[int(line["step"])] = data
    records, wall = [], 0.0
    for step in sorted(by_step):
        data = by_step[step]
        wall += float(data.get("timing_s/step", 0.0))
        rec = {"kind": "train", "step": step, "rollouts": step * rollouts_per_step, "wall_s": round(wall, 3)}
        rec.update({ours: float(data[theirs]) for ours, theirs in fields.items() if theirs in data})
        rec.update(
            {
                ours: float(data[num]) / float(data[den])
                for ours, (num, den) in RATIO_FIELDS.items()
                if num in data and den in data and float(data[den]) > 0
            }
        )
        records.append(rec)
    return records


def write_run_files(
    job: dict,
    method: str,
    seed: int,
    verl_log,
    val_dir: str | Path,
    out_dir: str | Path,
    pre_rollouts: int = 0,
) -> dict:
    """Write ``metrics.jsonl`` and ``summary.json`` (in that order, each atomically: a reader that
    finds ``summary.json`` finds the metrics too) for one verl run of ``method`` under ``job``.
    ``pre_rollouts`` are the rollouts that seeded the run's experience bank (the ``bank`` rule's
    ``bank.json``), counted in the ledger as the suite's loop counts them."""
    from tasks.base import get_domain

    budget = int(job["train"]["rollout_budget"])
    rollouts_per_step = int(job["train"]["rollouts_per_step"])
    evals = validation_records(val_dir, rollouts_per_step)
    if job.get("heldout_domain"):  # evaluated on a benchmark: its version travels with each evaluation
        heldout = get_domain(job["heldout_domain"])
        for rec in evals:
            rec["heldout_domain_version"] = heldout.version
        heldout.close()
    from methods.verl_backend.adapters import adapter_for

    trains = train_records(verl_log, rollouts_per_step, adapter_for(method).run_file_fields)
    if not evals or evals[-1]["rollouts"] != budget:
        last = evals[-1]["rollouts"] if evals else "none"
        raise ValueError(
            f"the run's last validation is at {last} rollouts, not at its budget {budget}: "
            "set trainer.test_freq so that verl validates after the last step (and before the first)"
        )
    used = trains[-1]["rollouts"] if trains else 0
    if used != budget:
        raise ValueError(f"the run logged {used} rollouts of its budget {budget} (unfinished?)")
    # verl validates after a step's update, as the suite's loop evaluates after the step that reached it
    records = sorted(evals + trains, key=lambda r: (r["step"], r["kind"] == "eval"))
    out = Path(out_dir)
    write_text_atomic(out / "metrics.jsonl", "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    domain = get_domain(job["domain"], seed=job["task_seed"], **job["domain_options"])
    try:
        version = domain.version
    finally:
        domain.close()
    summary = {
        "backend": "verl",
        "domain": job["domain"],
        "domain_version": version,
        "method": method,
        "seed": seed,
        "job": job,
        "ledger": {
            "rollouts": used,
            "rollout_budget": budget,
            "steps": len(trains),
            "pre_rollouts": int(pre_rollouts),
            "wall_s": trains[-1]["wall_s"] if trains else 0.0,
        },
        "final": {k: v for k, v in evals[-1].items() if k.startswith("heldout_")},
        **provenance(),
    }
    write_json_atomic(out / "summary.json", summary)
    return summary
