"""The paper's figures and tables beyond Table 1: probability of improvement, rollouts-to-target,
behaviour, the sample-efficiency figure and the report, on synthetic runs with known answers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis import behaviour, improvement, report, rollouts_to_target, sample_efficiency, teacher_check
from analysis.runs import MixedRunsError, finals
from analysis.stats import poi_ci, probability_of_improvement

TOOL = {
    "heldout_turns": 6.0,
    "heldout_tool_calls": 5.0,
    "heldout_repeated_calls": 0.5,
    "heldout_first_response_tokens": 12.0,
}


def _run(tmp, domain, method, seed, curve, budget=None, version="v1", extra=None):
    """A finished run whose held-out reward at rollouts 0, 100, 200, ... is ``curve``."""
    budget = budget if budget is not None else 100 * (len(curve) - 1)
    d = tmp / "runs" / domain / method / f"seed{seed}"
    d.mkdir(parents=True)
    evals = [{"kind": "eval", "rollouts": 100 * i, "heldout_reward": v, **(extra or {})} for i, v in enumerate(curve)]
    final = {k: v for k, v in evals[-1].items() if k.startswith("heldout_")}
    (d / "summary.json").write_text(
        json.dumps(
            {
                "domain": domain,
                "method": method,
                "seed": seed,
                "domain_version": version,
                "final": final,
                "ledger": {"rollout_budget": budget, "rollouts": budget},
            }
        )
    )
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(e) for e in evals) + "\n")
    return str(d / "summary.json")


def _vanilla(tmp, domain, seed, value, extra=None):
    p = tmp / f"ws_{domain}_{seed}.json"
    p.write_text(
        json.dumps({"domain": domain, "seed": seed, "domain_version": "v1", "heldout_reward": value, **(extra or {})})
    )
    return str(p)


# -- probability of improvement -------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=6), st.lists(st.integers(0, 5), min_size=1, max_size=6))
def test_poi_matches_rliable_and_is_complementary(x, y):
    from rliable import metrics  # the field's implementation (its interval code needs arch, which pandas 3 breaks)

    x, y = np.array(x, float) / 5, np.array(y, float) / 5
    assert probability_of_improvement(x, y) == pytest.approx(metrics.probability_of_improvement(x[:, None], y[:, None]))
    assert probability_of_improvement(x, y) + probability_of_improvement(y, x) == pytest.approx(1.0)


def test_poi_ci_brackets_and_is_degenerate_when_one_side_always_wins():
    p, lo, hi = poi_ci([([0.5, 0.6, 0.7], [0.1, 0.2, 0.3])], n_boot=500)
    assert (p, lo, hi) == (1.0, 1.0, 1.0)
    p, lo, hi = poi_ci([([0.1, 0.5, 0.3], [0.2, 0.4, 0.3]), ([0.0, 1.0], [0.5, 0.5])], n_boot=500)
    assert lo <= p <= hi and 0 <= lo and hi <= 1
    with pytest.raises(ValueError):
        probability_of_improvement([], [1.0])


def test_improvement_table_per_domain_and_overall(tmp_path):
    runs = [_run(tmp_path, d, "lopd", s, [0.1, 0.3 + s / 10]) for d in ("code", "tooluse") for s in range(3)]
    runs += [_run(tmp_path, d, "grpo", s, [0.1, 0.1 + s / 100]) for d in ("code", "tooluse") for s in range(3)]
    df = improvement.compute(finals([], runs), "lopd", n_boot=200)
    assert set(df.domain) == {"code", "tooluse", "all"} and set(df.baseline) == {"grpo"}
    assert (df.poi == 1.0).all() and (df.dropna(subset=["paired_wins"]).paired_wins == 1.0).all()
    with pytest.raises(ValueError, match="no runs of 'nope'"):
        improvement.compute(finals([], runs), "nope")


# -- rollouts to target ---------------------------------------------------------------------------


def test_rollouts_to_target_known_crossings(tmp_path):
    runs = [_run(tmp_path, "tooluse", "grpo", s, [0.1, 0.2, 0.3, 0.4]) for s in range(3)]  # target 0.4
    runs += [_run(tmp_path, "tooluse", "fast", s, [0.1, 0.45, 0.5, 0.5]) for s in range(3)]
    runs += [_run(tmp_path, "tooluse", "never", s, [0.1, 0.1, 0.1, 0.1]) for s in range(3)]
    runs += [_run(tmp_path, "tooluse", "above", s, [0.9, 0.9, 0.9, 0.9]) for s in range(3)]
    df = rollouts_to_target.compute(runs, "grpo", n_boot=200).set_index("method")
    assert df.loc["grpo", "rollouts_to_target"] == 300 and df.loc["grpo", "ratio"] == pytest.approx(1.0)
    assert df.loc["fast", "rollouts_to_target"] == 100 and df.loc["fast", "ratio"] == pytest.approx(1 / 3)
    assert (df.loc["fast", "ci_low"], df.loc["fast", "ci_high"]) == (100, 100) and df.loc[
        "fast", "reached_share"
    ] == 1.0
    assert pd.isna(df.loc["never", "rollouts_to_target"]) and df.loc["never", "reached_share"] == 0.0
    assert df.loc["above", "at_start"] and not df.loc["fast", "at_start"]
    assert df.paired.all() and np.allclose(df.target, 0.4)
    md = rollouts_to_target.to_markdown(df.reset_index())
    assert "not reached" in md and "target <= its score before training" in md


def test_rollouts_to_target_needs_the_reference_and_refuses_mixed_budgets(tmp_path):
    a = _run(tmp_path, "code", "lopd", 0, [0.1, 0.2])
    with pytest.raises(ValueError, match="no 'grpo' runs"):
        rollouts_to_target.compute([a], "grpo")
    b = _run(tmp_path, "code", "grpo", 0, [0.1, 0.2, 0.3])
    with pytest.raises(MixedRunsError, match="mixes rollout budgets") as e:
        rollouts_to_target.compute([a, b], "grpo")
    assert a in str(e.value) and b in str(e.value)


# -- behaviour -------------------------------------------------------------------------------------


def test_behaviour_quantities_per_seed(tmp_path):
    runs = [
        _run(tmp_path, "tooluse", "grpo", s, [0.1, 0.5], extra={**TOOL, "heldout_tool_calls": 4.0 + s})
        for s in range(2)
    ]
    van = [_vanilla(tmp_path, "tooluse", s, 0.1, extra=TOOL) for s in range(2)]
    seeds = behaviour.per_seed(finals(van, runs))
    g = seeds[seeds.method == "grpo"].sort_values("seed")
    assert list(g.calls_per_step) == pytest.approx([4 / 6, 5 / 6]) and list(g.reward_per_call) == pytest.approx(
        [0.5 / 4, 0.5 / 5]
    )
    df = behaviour.summarize(seeds)
    row = df[(df.method == "grpo") & (df.metric == "calls_per_step")].iloc[0]
    assert row["mean"] == pytest.approx(0.75) and row.n_seeds == 2
    assert "| Vanilla |" in behaviour.to_markdown(df) and "| GRPO |" in behaviour.to_markdown(df)


def test_behaviour_refuses_runs_without_tool_metrics(tmp_path):
    runs = [_run(tmp_path, "code", "grpo", 0, [0.1, 0.5])]
    with pytest.raises(ValueError, match="behaviour metrics .* missing"):
        behaviour.per_seed(finals([], runs))


# -- figure and report ----------------------------------------------------------------------------


def test_sample_efficiency_bands_and_files(tmp_path):
    runs = [
        _run(tmp_path, "code", m, s, [0.1 + s / 10, 0.2 + s / 10 + (m == "lopd") / 10])
        for m in ("grpo", "lopd", "newbaseline")
        for s in range(3)
    ]
    van = [_vanilla(tmp_path, "code", 0, 0.1)]  # one base policy per domain
    bands = sample_efficiency.band_table(van, runs)
    last = bands[bands.rollouts == 100].set_index("method")
    # the bottom row: minus GRPO at the same seed and rollout count
    assert last.loc["grpo", "delta_mean"] == pytest.approx(0.0) and last.loc["lopd", "delta_mean"] == pytest.approx(0.1)
    assert last.loc["lopd", "delta_low"] == pytest.approx(0.1)  # the same difference on every seed: no spread
    assert (
        last.loc["lopd", "ci_low"] < 0.4 - 0.05 and last.loc["lopd", "ci_high"] > 0.4 + 0.05
    )  # while the rewards themselves spread over seeds
    written = sample_efficiency.plot(bands, tmp_path / "fig" / "se.png")
    assert [p.suffix for p in written] == [".png", ".pdf"] and all(p.stat().st_size > 1000 for p in written)


# -- teacher sanity check ----------------------------------------------------------------------


def _gain(summary: str, gain: float, at_step: int = 2, extra: dict | None = None) -> None:
    """Append train records to a run's metrics; the gain (and ``extra``) is logged once, at ``at_step``."""
    m = Path(summary).parent / "metrics.jsonl"
    recs = [
        {
            "kind": "train",
            "step": s,
            "rollouts": 32 * s,
            **({"teacher_context_gain": gain, **(extra or {})} if s == at_step else {}),
        }
        for s in (1, 2, 3)
    ]
    recs.append({"kind": "train", "step": 4, "rollouts": 128, "teacher_context_gain": 99.0})  # never a second value
    m.write_text(m.read_text() + "".join(json.dumps(r) + "\n" for r in recs))


def test_teacher_check_reads_each_runs_first_gain_and_counts_passing_seeds(tmp_path):
    runs = [_run(tmp_path, "tooluse", m, s, [0.1, 0.2]) for m in ("sdpo", "opsd", "grpo") for s in range(3)]
    for p, g in zip(runs[:6], [-0.15, 0.01, -0.02, 0.03, 0.02, 0.04]):
        _gain(p, g)
    df = teacher_check.per_run(runs)
    assert set(df.method) == {"sdpo", "opsd"}  # GRPO has no teacher context
    assert (
        df[df.method == "sdpo"].gain.tolist() == [-0.15, 0.01, -0.02]
        and (df.step == 2).all()
        and (df.rollouts == 64).all()
    )
    summ = teacher_check.summarize(df).set_index("method")
    assert summ.loc["sdpo", "seeds_passing"] == 1 and summ.loc["opsd", "seeds_passing"] == 3
    assert summ.loc["sdpo", "mean_gain"] == pytest.approx(-0.16 / 3) and summ.loc["sdpo", "min_gain"] == -0.15
    md = teacher_check.to_markdown(df, teacher_check.summarize(df))
    assert (
        "| Tool use | SDPO | 0: -0.1500, 1: +0.0100, 2: -0.0200 | -0.0533 | 1/3 | – |" in md
    )  # no failed-attempt shift logged
    csv, out_md = tmp_path / "tc.csv", tmp_path / "tc.md"
    teacher_check.main(["--runs", *runs, "--out-csv", str(csv), "--out-md", str(out_md)])
    head = report.headline_teacher_check(pd.read_csv(csv))
    assert head == [
        "- Tool use, teacher sanity check (own context helps the teacher; nats/token, logged once per run): "
        "OPSD 3/3 seeds (mean +0.030), SDPO 1/3 seeds (mean -0.053)."
    ]
    assert "By kind" not in out_md.read_text() and teacher_check.kinds_of(pd.read_csv(csv)) == []
    teacher_check.main(
        ["--runs", *runs[6:], "--out-csv", str(csv), "--out-md", str(out_md)]
    )  # no self-distillation run
    assert (
        pd.read_csv(csv).empty
        and "No run logged" in out_md.read_text()
        and report.headline_teacher_check(pd.read_csv(csv)) == []
    )


def test_teacher_check_splits_the_gain_by_kind_where_a_run_logged_it(tmp_path):
    runs = [_run(tmp_path, "code", m, s, [0.1, 0.2]) for m in ("sdpo", "opsd") for s in range(2)]
    kinds = [(0.02, 3, -0.01, 9), (0.04, 1, 0.002, 11)]
    for p, (gs, ns, gf, nf) in zip(runs[:2], kinds):
        _gain(
            p,
            0.0,
            extra={
                "teacher_context_gain_sibling": gs,
                "teacher_context_pairs_sibling": ns,
                "teacher_context_gain_feedback_only": gf,
                "teacher_context_pairs_feedback_only": nf,
                "teacher_failed_shift": -0.01,
                "teacher_failed_shift_feedback_only": -0.02,
            },
        )
    for p, shift in zip(runs[2:], (-0.1, -0.3)):
        _gain(p, 0.03, extra={"teacher_failed_shift": shift, "teacher_failed_attempts": 20})
    df = teacher_check.per_run(runs)
    assert teacher_check.kinds_of(df) == ["feedback_only", "sibling"]
    assert (
        df[df.method == "sdpo"].gain_sibling.tolist() == [0.02, 0.04]
        and df[df.method == "opsd"].gain_sibling.isna().all()
    )
    md = teacher_check.to_markdown(df, teacher_check.summarize(df))
    assert (
        "| Code | OPSD | 0: +0.0300, 1: +0.0300 | +0.0300 | 2/2 | -0.2000 |" in md
        and "| Code | SDPO | 0: +0.0000, 1: +0.0000 | +0.0000 | 0/2 | -0.0100 |" in md
    )
    assert "| Code | SDPO | sibling | 0: +0.0200 (3), 1: +0.0400 (1) | +0.0300 | 2/2 | – |" in md
    assert "| Code | SDPO | feedback only | 0: -0.0100 (9), 1: +0.0020 (11) | -0.0040 | 1/2 | -0.0200 |" in md
    assert "| Code | OPSD | sibling" not in md


def test_report_numbers_come_from_its_inputs(tmp_path):
    t1 = pd.DataFrame(
        [
            {
                "domain": "code",
                "method": "vanilla",
                "metric": "heldout_reward",
                "mean": 0.2,
                "ci_low": 0.1,
                "ci_high": 0.3,
                "n_seeds": 3,
                "rollout_budget": 0,
                "pre_rollouts": 0,
            },
            {
                "domain": "code",
                "method": "grpo",
                "metric": "heldout_reward",
                "mean": 0.25,
                "ci_low": 0.2,
                "ci_high": 0.3,
                "n_seeds": 3,
                "rollout_budget": 640,
                "pre_rollouts": 0,
            },
            {
                "domain": "code",
                "method": "lopd",
                "metric": "heldout_reward",
                "mean": 0.4567,
                "ci_low": 0.41,
                "ci_high": 0.5,
                "n_seeds": 3,
                "rollout_budget": 640,
                "pre_rollouts": 32,
            },
        ]
    )
    (tmp_path / "t1.csv").write_text(t1.to_csv(index=False))
    (tmp_path / "t1.md").write_text("# Table 1: x\n\n| a |\n")
    args = report.argparse.Namespace(
        table1=str(tmp_path / "t1.csv"),
        table1_md=str(tmp_path / "t1.md"),
        targets=None,
        targets_md=None,
        improvement=None,
        improvement_md=None,
        ablations=None,
        ablations_md=None,
        behaviour_md=None,
        dynamics=None,
        diagnosis=None,
        diagnosis_md=None,
        figure=None,
        dynamics_figure=None,
        teacher_check=None,
        teacher_check_md=None,
        warmstarts=[
            _vanilla(tmp_path, "code", 0, 0.2, extra={"context_gain_own_solution": 0.0312}),
            _vanilla(
                tmp_path,
                "code",
                1,
                0.2,
                extra={"context_gain_feedback": 0.0011, "stage1_context_gain_feedback": -0.0205},
            ),
        ],
        testbed=str(tmp_path / "tb.csv"),
        testbed_md=str(tmp_path / "tb.md"),
        paired_md=None,
        compute_md=None,
        compute_figure=None,
        out=str(tmp_path / "report.md"),
    )
    pd.DataFrame(
        [
            {"domain": "code", "check": "grpo_gain", "value": 0.04, "threshold": ">= 0.1", "pass": False},
            {"domain": "code", "check": "eval_se", "value": 0.01, "threshold": "<= 0.015", "pass": True},
        ]
    ).to_csv(tmp_path / "tb.csv", index=False)
    (tmp_path / "tb.md").write_text("# Test-bed validity (x)\n\n| check |\n")
    text = report.build(args)
    assert (
        text.index("### Test-bed validity") < text.index("## Headline") < text.index("## Table 1")
    )  # the test bed comes first
    assert "- Code: test-bed checks failing: grpo_gain 0.040 (needs >= 0.1)." in text
    assert "| Code | 0 | +0.0312 | not measured |" in text
    assert (
        "| Code | 1 | not measured | not measured | not measured | +0.0011 (stage 1 -0.0205) | not measured |" in text
    )  # after the on-policy stage, stage 1's beside it
    assert (
        "LOPD 0.457" in text and "LOPD − GRPO = +0.207 (CIs separate, LOPD higher)" in text and "### Table 1: x" in text
    )
    t1.loc[t1.method == "lopd", ["mean", "ci_low"]] = [0.26, 0.2]
    (tmp_path / "t1.csv").write_text(t1.to_csv(index=False))
    text = report.build(args)
    assert "0.457" not in text and "(the 95 % CIs overlap)" in text
    with pytest.raises(SystemExit):
        report.main(
            [
                "--table1",
                str(tmp_path / "missing.csv"),
                "--table1-md",
                str(tmp_path / "t1.md"),
                "--out",
                str(tmp_path / "r.md"),
            ]
        )
