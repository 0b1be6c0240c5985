"""End to end: the Snakemake pipeline on the smoke profile, in a temporary copy of the repo."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from analysis.publish import stale_reason
from methods.core.config import cold_start_key

ROOT = Path(__file__).resolve().parents[1]


def _copy_repo(dst: Path) -> None:
    # results/base: the shipped base policies (the smoke profile installs the small profile's)
    for name in ("Snakefile", "config", "rules", "envs", "methods", "tasks", "analysis", "docs", "results/base"):
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dst / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, dst / name)


def _snakemake(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", *args]
    # the rules call `python`: make it this interpreter even from a non-activated venv
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=1500, env=env)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a hang guard for the whole smoke pipeline, not a speed check
def test_smoke_pipeline_writes_table1(tmp_path):
    """The smoke profile from the small profile's shipped base policies, every ablation variant on
    (the profile itself runs the text control only): every rule, non-zero rewards, a signal for every
    method."""
    _copy_repo(tmp_path)
    cfg_path = tmp_path / "config" / "config.yaml"
    every_variant = yaml.safe_load(cfg_path.read_text())
    assert every_variant["profiles"]["smoke"].pop("ablations") == ["lopd_text"]
    cfg_path.write_text(yaml.safe_dump(every_variant, sort_keys=False))
    lint = _snakemake(tmp_path, "--lint", "--config", "profile=smoke")
    assert lint.returncode == 0, lint.stdout + lint.stderr
    # every output of the profile lies under results/smoke/; results/table1.* and results/report.md
    # show the headline profile (here smoke, for the test; small by default)
    smoke_cfg = ("--config", "profile=smoke", "headline_profile=smoke")
    targets = ("results/table1.csv", "results/report.md", *smoke_cfg)
    # the publish rule too: the report kept in the repository, stamped with the configuration's digest
    res = _snakemake(tmp_path, *targets[:2], "docs/results/smoke/report.md", *smoke_cfg)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    res_dir = tmp_path / "results" / "smoke"
    df = pd.read_csv(res_dir / "table1.csv")
    assert (tmp_path / "results" / "table1.csv").read_bytes() == (res_dir / "table1.csv").read_bytes()
    assert set(df.domain) == {"tooluse", "code"}
    configured = set(yaml.safe_load((tmp_path / "config" / "config.yaml").read_text())["methods"])
    assert set(df.method) == {"vanilla"} | configured  # every method of the config line-up is in Table 1
    rr = df[df.method == "retrieval_rl"]
    assert (rr.pre_rollouts == 64).all() and (
        df[df.method == "grpo"].pre_rollouts == 0
    ).all()  # the bank seed is recorded
    assert (df[df.method != "vanilla"].n_seeds == 2).all() and (
        df[df.method == "vanilla"].n_seeds == 1
    ).all()  # one base policy per domain
    assert (res_dir / "table1.md").exists() and (tmp_path / "results" / "table1.md").exists()
    # the base policies are the small profile's, installed (not trained) and evaluated at the smoke's size
    smoke = tmp_path / "results" / "smoke"
    for domain in ("code", "tooluse"):
        ws = json.loads((smoke / "warmstart" / domain / "eval.json").read_text())
        assert ws["reevaluated"]["settings"] == ["train.eval_episodes"] and ws["heldout_episodes"] == 32
        log = (smoke / "logs" / "warmstart" / f"{domain}.log").read_text()
        assert f"installed the shipped base policy results/base/small/{domain}" in log
        assert not (smoke / "warmstart_stage1").exists()
    # a first run shows something: the base policies solve tasks, and every method learns from something
    assert (df[df.method == "vanilla"]["mean"] > 0).all() and (df["mean"] > 0).all()
    for p in smoke.glob("runs/*/*/seed0/metrics.jsonl"):
        steps = [json.loads(x) for x in p.read_text().splitlines()]
        steps = [r for r in steps if r["kind"] == "train"]
        signal = [r.get("signal_share") or r.get("skill_share") or r.get("trained_rollouts") for r in steps]
        assert any(signal), (p, signal)
    summary = tmp_path / "results" / "smoke" / "runs" / "code" / "grpo" / "seed0" / "summary.json"
    assert summary.exists()
    # LOPD's ablations: every variant (and LOPD itself) on the ablation domains, cold starts shared by K and J
    cfg = yaml.safe_load((tmp_path / "config" / "config.yaml").read_text())
    ab = pd.read_csv(res_dir / "ablations.csv")
    assert set(ab.method) == {"lopd"} | set(cfg["ablations"]) and set(ab.domain) == set(cfg["ablation_domains"])
    cold = {
        p.parent.parent.name
        for p in (tmp_path / "results" / "smoke" / "coldstart" / "tooluse").glob("*/seed0/composer.pt")
    }
    keys = {cold_start_key({**cfg, "profile": "smoke"}, "tooluse", m) for m in ["lopd", *cfg["ablations"]]}
    assert cold == keys - {None} and len(cold) == 5  # K32/J3 (shared), K8, K16, J1, no self-retrieval
    published = tmp_path / "docs" / "results" / "smoke"
    stamp = json.loads((published / "STAMP.json").read_text())
    assert stale_reason(stamp, {**cfg, "profile": "smoke"}) is None
    assert "](figures/sample_efficiency.png)" in (published / "report.md").read_text()
    assert (published / "figures" / "sample_efficiency.png").exists() and (published / "lopd_diagnosis.md").exists()
    dyn = pd.read_csv(res_dir / "lopd_dynamics.csv")
    assert {"lopd_beta", "lopd_kl", "lopd_margin"} <= set(dyn.metric) and (res_dir / "lopd_dynamics.png").exists()
    # the report gathers every table and figure, from these runs
    for name in (
        "figures/sample_efficiency.png",
        "figures/sample_efficiency.pdf",
        "rollouts_to_target.csv",
        "improvement.csv",
        "behaviour.csv",
    ):
        assert (res_dir / name).stat().st_size > 0, name
    # OPSD, SDPO and SDFT log their teacher sanity check on step 1 of every run; Skill-SD only once
    # its tasks have skills, which a 2-step smoke run may never reach
    tc = pd.read_csv(res_dir / "teacher_check.csv")
    n = tc.groupby(["domain", "method"]).size()
    assert (
        {"opsd", "sdpo", "sdft"} <= set(tc.method)
        and (n[n.index.get_level_values(1) != "skill_sd"] == 2).all()
        and (n <= 2).all()
    )
    rep = (tmp_path / "results" / "report.md").read_text()
    assert "![sample efficiency](smoke/figures/sample_efficiency.png)" in rep  # links resolve from results/
    lopd_code = df[(df.domain == "code") & (df.method == "lopd")].iloc[0]
    assert f"LOPD {lopd_code['mean']:.3f}" in rep or "best mean LOPD" in rep
    assert "## Behaviour" in rep and "P(LOPD > GRPO)" in rep and "## Teacher sanity check" in rep
    # the self-contained HTML report: every figure and table annotated with report() in the rules
    html = _snakemake(tmp_path, targets[1], "--report", "results/report.html", *targets[2:])
    assert html.returncode == 0, html.stdout[-3000:] + html.stderr[-3000:]
    page = (tmp_path / "results" / "report.html").read_text(errors="replace")
    assert all(name in page for name in ("sample_efficiency.png", "testbed.csv", "table1.csv", "ablations.csv")), (
        "report.html misses a figure or table"
    )
    # every run of a domain starts from its one base policy; the runs of a method differ by RL seed only
    for p in (tmp_path / "results" / "smoke" / "runs").glob("*/*/seed*/summary.json"):
        s = json.loads(p.read_text())
        assert s["warmstart"] == f"results/smoke/warmstart/{s['domain']}"
    # the test-bed checks: a row for every check on both domains (the smoke values need not pass)
    tb = pd.read_csv(res_dir / "testbed.csv")
    assert list(tb.columns) == ["domain", "check", "value", "threshold", "pass"]
    assert (
        set(tb.domain) == {"tooluse", "code"} and len(tb) == 2 * 6 and tb.groupby("domain").check.nunique().eq(6).all()
    )
    assert rep.index("## Test-bed validity") < rep.index("## Table 1")
    pr = pd.read_csv(res_dir / "paired.csv")
    assert set(pr.baseline) == {"grpo", "vanilla"} and (pr.n_seeds == 2).all() and "## Paired differences" in rep
    cp = pd.read_csv(res_dir / "compute.csv")
    assert (cp.train_s > 0).all() and (cp.token_passes > 0).all() and "## Compute-matched view" in rep
    # a second invocation has nothing to do
    again = _snakemake(tmp_path, *targets, "--dry-run")
    assert "Nothing to be done" in again.stdout + again.stderr
    # with the default headline (small), the smoke profile's outputs never land in results/table1.*
    (tmp_path / "results" / "table1.csv").unlink()
    elsewhere = _snakemake(tmp_path, "results/table1.csv", "--config", "profile=smoke")
    assert elsewhere.returncode != 0 and "ask for results/smoke/table1.csv" in elsewhere.stdout + elsewhere.stderr
    # a profile that names another's base policies is refused where they do not fit it
    other = _snakemake(tmp_path, "results/smoke/table1.csv", "--config", "profile=smoke", "task_seed=1", "--dry-run")
    assert other.returncode != 0 and "installs the base policies of profile small" in other.stdout + other.stderr


@pytest.mark.slow
@pytest.mark.timeout(1200)  # a hang guard, not a speed check
def test_base_policies_are_trained_in_two_stages_shipped_and_rebuilt(tmp_path):
    """The tiny profile trains its base policies from scratch: code's with the on-policy stage, tool
    use's stage 1 only; a shipped one is then installed instead, and base_rebuild rebuilds it bit for bit."""
    _copy_repo(tmp_path)
    tiny = tmp_path / "results" / "tiny"
    targets = [f"results/tiny/warmstart/{d}/eval.json" for d in ("code", "tooluse")]
    res = _snakemake(tmp_path, *targets, "--config", "profile=tiny")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    code_ws = json.loads((tiny / "warmstart" / "code" / "eval.json").read_text())
    tool_ws = json.loads((tiny / "warmstart" / "tooluse" / "eval.json").read_text())
    assert (
        code_ws["onpolicy_samples"] == 8
        and "stage1_heldout_reward" in code_ws
        and code_ws["job"]["warmstart"]["onpolicy_steps"] == 2
    )
    assert "onpolicy_samples" not in tool_ws and tool_ws["stage1_dir"] == "results/tiny/warmstart_stage1/tooluse"
    _check_shipped_base(tmp_path, tiny)


def _check_shipped_base(tmp_path: Path, tiny: Path) -> None:
    """A shipped base policy is installed instead of trained, and base_rebuild rebuilds it bit for bit."""
    from methods.core.config import resolve_job

    cfg = yaml.safe_load((tmp_path / "config" / "config.yaml").read_text())
    job = resolve_job({**cfg, "profile": "tiny"}, "code")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    ship = subprocess.run(
        [
            sys.executable,
            "-m",
            "methods.cli",
            "ship-base",
            "--job",
            json.dumps(job),
            "--seed",
            "0",
            "--warmstart",
            "results/tiny/warmstart/code",
            "--out",
            "results/base/tiny/code",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert ship.returncode == 0, ship.stderr
    built = (tiny / "warmstart" / "code" / "eval.json").read_bytes()
    shutil.rmtree(tiny / "warmstart" / "code")
    shutil.rmtree(tiny / "warmstart_stage1" / "code")
    res = _snakemake(tmp_path, "results/tiny/warmstart/code/eval.json", "--config", "profile=tiny")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert (tiny / "warmstart" / "code" / "eval.json").read_bytes() == built
    assert not (tiny / "warmstart_stage1" / "code").exists()  # installed, not trained
    # a changed setting makes the pipeline train the base policy again instead of installing it
    dry = _snakemake(
        tmp_path, "results/tiny/warmstart/code/eval.json", "--config", "profile=tiny", "task_seed=1", "--dry-run"
    )
    assert "warmstart_stage1" in dry.stdout and "built with other settings task_seed" in dry.stderr
    res = _snakemake(tmp_path, "results/tiny/base_rebuild/code/check.json", "--config", "profile=tiny")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    check = json.loads((tiny / "base_rebuild" / "code" / "check.json").read_text())
    assert check["bit_identical"] and check["scores_equal"] and "model/model.safetensors" in check["model_files"], check
    # another evaluation size: the shipped base still fits (its weights do not depend on it) and is
    # evaluated again with the new size instead of being trained
    cfg_path = tmp_path / "config" / "config.yaml"
    original = cfg_path.read_text()
    more = yaml.safe_load(original)
    more["profiles"]["tiny"]["train"]["eval_episodes"] = 20
    cfg_path.write_text(yaml.safe_dump(more))
    shutil.rmtree(tiny / "warmstart_stage1" / "code")  # (base_rebuild built it)
    try:
        res = _snakemake(tmp_path, "results/tiny/warmstart/code/eval.json", "--config", "profile=tiny")
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        ev = json.loads((tiny / "warmstart" / "code" / "eval.json").read_text())
        assert ev["heldout_episodes"] == 20 and ev["reevaluated"]["settings"] == ["train.eval_episodes"], ev
        assert ev["job"]["train"]["eval_episodes"] == 20
        assert not (tiny / "warmstart_stage1" / "code").exists()  # installed, not trained
    finally:
        cfg_path.write_text(original)


@pytest.mark.parametrize(
    "override, message",
    [
        ("profile=huge", "unknown profile 'huge'"),
        ("task_seed=-1", "task_seed"),
    ],
)
def test_bad_config_fails_before_any_job_and_writes_nothing(tmp_path, override, message):
    _copy_repo(tmp_path)
    res = _snakemake(tmp_path, "results/table1.csv", "--config", override)
    assert res.returncode != 0
    assert message in res.stdout + res.stderr
    assert [p.name for p in (tmp_path / "results").iterdir()] == ["base"]  # the shipped base policies only
