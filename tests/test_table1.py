"""Table 1 aggregation: CIs, ordering, and refusal to mix incomparable runs."""

from __future__ import annotations

import json

import pytest

from analysis.stats import bootstrap_ci
from analysis.table1 import MixedRunsError, load_runs, main, table


def _write_run(tmp, domain, method, seed, value, budget=64, version="v1", used=None):
    d = tmp / domain / method / f"seed{seed}"
    d.mkdir(parents=True)
    s = {
        "domain": domain,
        "method": method,
        "seed": seed,
        "domain_version": version,
        "final": {"heldout_reward": value},
        "ledger": {"rollout_budget": budget, "rollouts": used if used is not None else budget},
    }
    (d / "summary.json").write_text(json.dumps(s))
    (d / "metrics.jsonl").write_text(
        json.dumps({"kind": "eval", "step": 0, "rollouts": 0, "heldout_reward": value / 2})
        + "\n"
        + json.dumps({"kind": "eval", "step": 4, "rollouts": budget, "heldout_reward": value})
        + "\n"
    )
    return str(d / "summary.json")


def _write_vanilla(tmp, domain, seed, value, version="v1"):
    p = tmp / f"ws_{domain}_{seed}.json"
    p.write_text(json.dumps({"domain": domain, "seed": seed, "domain_version": version, "heldout_reward": value}))
    return str(p)


def test_bootstrap_ci_brackets_the_mean():
    m, lo, hi = bootstrap_ci([0.1, 0.2, 0.3, 0.4])
    assert lo <= m <= hi and m == pytest.approx(0.25)
    assert bootstrap_ci([0.5]) == (0.5, 0.5, 0.5)


def test_table_rows_and_files(tmp_path):
    runs = [_write_run(tmp_path, "code", "grpo", s, v) for s, v in [(0, 0.4), (1, 0.5), (2, 0.6)]]
    van = [_write_vanilla(tmp_path, "code", s, v) for s, v in [(0, 0.3), (1, 0.3), (2, 0.4)]]
    out = tmp_path / "out"
    main(
        [
            "--vanilla",
            *van,
            "--runs",
            *runs,
            "--out-csv",
            str(out / "t.csv"),
            "--out-md",
            str(out / "t.md"),
            "--out-curves",
            str(out / "c.csv"),
        ]
    )
    import pandas as pd

    df = pd.read_csv(out / "t.csv")
    assert list(df.columns) == [
        "domain",
        "method",
        "metric",
        "mean",
        "ci_low",
        "ci_high",
        "n_seeds",
        "rollout_budget",
        "pre_rollouts",
    ]
    assert list(df.method) == ["vanilla", "grpo"]
    g = df[df.method == "grpo"].iloc[0]
    assert (
        g["mean"] == pytest.approx(0.5)
        and g.ci_low < 0.5 < g.ci_high
        and g.n_seeds == 3
        and g.rollout_budget == 64
        and g.pre_rollouts == 0
    )
    curves = pd.read_csv(out / "c.csv")
    assert set(curves.rollouts) == {0, 64}
    assert "| code | grpo | 0.500 |" in (out / "t.md").read_text()


def test_refuses_unequal_budgets_and_names_the_runs(tmp_path):
    a = _write_run(tmp_path, "code", "grpo", 0, 0.4, budget=64)
    b = _write_run(tmp_path, "code", "other", 0, 0.4, budget=128)
    with pytest.raises(MixedRunsError, match="mixes rollout budgets") as e:
        table(load_runs([], [a, b]))
    assert a in str(e.value) and b in str(e.value)


def test_refuses_mixed_task_versions(tmp_path):
    a = _write_run(tmp_path, "code", "grpo", 0, 0.4, version="code-v1")
    v = _write_vanilla(tmp_path, "code", 0, 0.3, version="code-v0")
    with pytest.raises(MixedRunsError, match="mixes task versions"):
        table(load_runs([v], [a]))


def test_refuses_unfinished_runs(tmp_path):
    a = _write_run(tmp_path, "code", "grpo", 0, 0.4, budget=64, used=32)
    with pytest.raises(MixedRunsError, match="used 32 rollouts of its budget 64"):
        table(load_runs([], [a]))
