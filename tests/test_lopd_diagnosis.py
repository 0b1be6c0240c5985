"""analysis/lopd_diagnosis.py on hand-made runs: each quantity read as documented, nulls skipped,
variants and profiles kept apart, and the latent-against-text gap per profile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.lopd_diagnosis import diagnose, latent_text_gaps, run_quantities, to_markdown


def _run(root: Path, profile: str, method: str, seed: int, steps: list[dict], reward: float, margin=0.05) -> Path:
    d = root / profile / "runs" / "tooluse" / method / f"seed{seed}"
    d.mkdir(parents=True)
    job = {"profile": profile, "method_config": {"margin": margin}}
    if method != "lopd":
        job["run_name"] = method
    (d / "summary.json").write_text(
        json.dumps(
            {"domain": "tooluse", "method": "lopd", "seed": seed, "job": job, "final": {"heldout_reward": reward}}
        )
    )
    recs = [{"kind": "eval", "step": 0, "heldout_reward": 0.1}]
    recs += [{"kind": "train", "step": i + 1, **s} for i, s in enumerate(steps)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return d / "summary.json"


STEPS = [
    {
        "signal_share": 1.0,
        "retrieved_self": 0.25,
        "teacher_context_gain": 0.02,
        "teacher_minus_student_expert": 0.02,
        "coldstart_latent_gain": 0.03,
        "coldstart_text_gain": 0.05,
        "lopd_success_delta": None,
        "lopd_failed_delta": -0.1,
        "lopd_beta": 0.0,
        "lopd_margin": 0.01,
    },
    {"signal_share": 0.5, "retrieved_self": 0.75, "lopd_success_delta": 0.2, "lopd_failed_delta": -0.3,
     "lopd_beta": 0.02, "lopd_margin": 0.03},
    {
        "signal_share": 1.0,
        "retrieved_self": 0.5,
        "lopd_success_delta": None,
        "lopd_failed_delta": -0.2,
        "lopd_beta": 0.04,
        "lopd_margin": 0.02,
        "teacher_minus_student_expert": -0.01,
    },
]  # fmt: skip


def test_each_quantity_of_one_run(tmp_path):
    q = run_quantities(_run(tmp_path, "small", "lopd", 0, STEPS, 0.4))
    assert q["method"] == "lopd" and q["profile"] == "small"
    assert q["signal_share"] == pytest.approx(2.5 / 3) and q["retrieved_self"] == pytest.approx(0.5)
    assert (q["adv_success_first"], q["adv_success_last"]) == (0.2, 0.2)  # the only step with a success
    assert (q["adv_failed_first"], q["adv_failed_last"]) == (-0.1, -0.2)
    assert q["beta_positive_share"] == pytest.approx(2 / 3) and q["beta_final"] == 0.04
    assert q["delta_mean"] == pytest.approx(0.02) and q["delta_minus_margin"] == pytest.approx(-0.03)
    assert (q["expert_gap_first"], q["expert_gap_last"]) == (0.02, -0.01)
    assert q["coldstart_latent_gain"] == 0.03 and q["coldstart_solution_gain"] is None
    assert q["heldout_reward"] == 0.4


def test_seeds_average_and_variants_and_profiles_stay_apart(tmp_path):
    paths = [
        _run(tmp_path, "small", "lopd", 0, STEPS, 0.4),
        _run(tmp_path, "small", "lopd", 1, STEPS, 0.6),
        _run(tmp_path, "small", "lopd_text", 0, [{**STEPS[0], "teacher_context_gain": 0.05}], 0.45),
        _run(tmp_path, "small-wide", "lopd", 0, STEPS, 0.7),
        _run(tmp_path, "small-wide", "lopd_text", 0, [{**STEPS[0], "teacher_context_gain": 0.01}], 0.5),
    ]
    df = diagnose([str(p) for p in paths])
    row = df[(df.profile == "small") & (df.method == "lopd") & (df.quantity == "heldout_reward")].iloc[0]
    assert row["mean"] == pytest.approx(0.5) and row["n_seeds"] == 2 and row["ci_low"] <= 0.5 <= row["ci_high"]
    gaps = dict(latent_text_gaps(df))
    assert gaps["small"]["heldout_reward"] == pytest.approx(0.05)
    assert gaps["small-wide"]["heldout_reward"] == pytest.approx(0.2)
    assert gaps["small"]["teacher_context_gain"] == pytest.approx(0.02 - 0.05)
    assert gaps["small"]["coldstart_latent_gain"] == pytest.approx(0.03 - 0.05)
    md = to_markdown(df)
    assert "small/lopd" in md and "small-wide/lopd_text" in md and "| small-wide | +0.200 |" in md
    assert md.index("small/lopd |") < md.index("small/lopd_text")  # LOPD first, its control next
