"""The test-bed checks, paired differences and the compute-matched view, on synthetic runs with
known answers; the probe's statistics; the ledger's token passes."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis import compute, paired, testbed
from analysis.runs import final_rows, finals
from methods.core.evaluate import mean_se
from methods.testbed import paired_gain

from .test_report import _run, _vanilla


def _probe(domain, ref=0.4, ret=0.06, same=0.9, se=0.01):
    return {
        "domain": domain,
        "reference_gain": ref,
        "retrieval_gain": ret,
        "retrieval_same_group": same,
        "reward_no_context_se": se,
    }


def test_every_check_has_a_row_per_domain_and_passes_only_past_its_threshold(tmp_path):
    van = _vanilla(tmp_path, "code", 0, 0.30, {"heldout_reward_se": 0.012})
    runs = [
        _run(tmp_path, "code", "grpo", s, [0.30, v], extra={"heldout_reward_se": 0.013})
        for s, v in enumerate([0.45, 0.42, 0.48])
    ]
    df = testbed.checks([_probe("code")], final_rows([van], runs))
    assert list(df.columns) == ["domain", "check", "value", "threshold", "pass"] and set(df.check) == set(
        testbed.CHECKS
    )
    got = df.set_index("check")
    assert got.loc["grpo_gain", "value"] == pytest.approx(0.15) and got.loc["grpo_gain", "pass"]
    assert got.loc["grpo_gain_ci_low", "value"] == pytest.approx(0.12) and got.loc["grpo_gain_ci_low", "pass"]
    assert (
        got.loc["eval_se", "value"] == pytest.approx(0.013) and got.loc["eval_se", "pass"]
    )  # the largest SE of any evaluation
    assert df["pass"].all()
    # just below each threshold fails; a missing input is 'not measured' and fails
    weak = testbed.checks([_probe("code", ref=0.2999, ret=0.0499, same=0.7999, se=0.0151)], final_rows([van], runs[:1]))
    w = weak.set_index("check")
    assert (
        not w.loc["reference_gain", "pass"]
        and not w.loc["retrieval_gain", "pass"]
        and not w.loc["retrieval_same_group", "pass"]
        and not w.loc["eval_se", "pass"]
    )
    alone = testbed.checks([_probe("tooluse")], final_rows([van], runs)).set_index(["domain", "check"])
    assert math.isnan(alone.loc[("tooluse", "grpo_gain"), "value"]) and not alone.loc[("tooluse", "grpo_gain"), "pass"]
    assert "not measured" in testbed.to_markdown(alone.reset_index()) and "**no**" in testbed.to_markdown(weak)


def test_headroom_whose_seeds_disagree_fails_the_ci_check(tmp_path):
    van = _vanilla(tmp_path, "code", 0, 0.30)
    runs = [_run(tmp_path, "code", "grpo", s, [0.30, v]) for s, v in enumerate([0.70, 0.25, 0.60])]
    got = testbed.checks([], final_rows([van], runs)).set_index("check")
    assert (
        got.loc["grpo_gain", "pass"]
        and got.loc["grpo_gain_ci_low", "value"] < 0
        and not got.loc["grpo_gain_ci_low", "pass"]
    )


def test_paired_differences_pair_runs_by_seed(tmp_path):
    van = _vanilla(tmp_path, "code", 0, 0.20)
    runs = [_run(tmp_path, "code", "grpo", s, [0.2, v]) for s, v in enumerate([0.30, 0.50, 0.40])]
    runs += [
        _run(tmp_path, "code", "lopd", s, [0.2, v]) for s, v in enumerate([0.35, 0.55, 0.45])
    ]  # GRPO + 0.05 on every seed
    df = paired.paired(finals([van], runs)).set_index(["method", "baseline"])
    assert df.loc[("lopd", "grpo"), "mean_diff"] == pytest.approx(0.05)
    assert (
        df.loc[("lopd", "grpo"), "ci_low"] == pytest.approx(0.05) and df.loc[("lopd", "grpo"), "excludes_zero"]
    )  # no seed noise left
    assert df.loc[("lopd", "vanilla"), "mean_diff"] == pytest.approx(0.25) and df.loc[
        ("grpo", "vanilla"), "mean_diff"
    ] == pytest.approx(0.20)
    assert ("grpo", "grpo") not in df.index and "| Code | LOPD | GRPO | +0.050 *" in paired.to_markdown(
        df.reset_index()
    )


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=2, max_size=50))
def test_mean_se_is_the_sample_sd_over_root_n(xs):
    mean, se = mean_se(xs)
    s = pd.Series(xs)
    assert mean == pytest.approx(s.mean()) and se == pytest.approx(s.std(ddof=1) / math.sqrt(len(xs)), abs=1e-12)
    gain, _ = paired_gain(xs, xs)
    assert gain == 0


def test_compute_view_subtracts_evaluations_and_sums_every_pass(tmp_path):
    ledger = {
        "wall_s": 100.0,
        "eval_wall_s": 30.0,
        "rollout_tokens": 10,
        "student_fwd_tokens": 20,
        "student_bwd_tokens": 20,
        "teacher_tokens": 5,
        "teacher_bwd_tokens": 5,
        "composer_fwd_tokens": 3,
        "composer_bwd_tokens": 3,
    }
    assert compute.costs(ledger) == {"train_s": 70.0, "token_passes": 66.0}
    runs = [
        _run(tmp_path, "code", "grpo", 0, [0.1, 0.3], extra={"wall_s": 50.0, "rollout_tokens": 100}),
        _run(
            tmp_path,
            "code",
            "lopd",
            0,
            [0.1, 0.3],
            extra={"wall_s": 150.0, "rollout_tokens": 100, "teacher_tokens": 200},
        ),
    ]
    df = compute.table(compute.points(runs)).set_index("method")
    assert df.loc["lopd", "train_s_vs_grpo"] == pytest.approx(3.0) and df.loc[
        "lopd", "token_passes_vs_grpo"
    ] == pytest.approx(3.0)
    compute.plot(compute.points(runs), tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 0


def test_ledger_counts_passes_and_refuses_unknown_counters():
    from methods.core.ledger import PASS_FIELDS, Ledger

    led = Ledger(10)
    led.add_passes(student_fwd_tokens=5, student_bwd_tokens=5)
    led.add_eval_time(1.5)
    snap = led.snapshot()
    assert snap["student_fwd_tokens"] == 5 and snap["eval_wall_s"] == 1.5 and set(PASS_FIELDS) <= set(snap)
    with pytest.raises(KeyError, match="unknown token-pass counter"):
        led.add_passes(studnet_fwd_tokens=1)
    again = Ledger(10)
    again.load_state_dict(json.loads(json.dumps(led.state_dict())))
    assert again.snapshot() == snap
