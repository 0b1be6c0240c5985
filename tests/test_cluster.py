"""The SLURM workflow profile (config/slurm): the grid planned as cluster jobs, GPUs where the policy runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "config" / "slurm" / "config.yaml"
POLICY_RULES = {"warmstart_stage1", "warmstart", "base_rebuild", "bank", "retrieved_eval", "coldstart", "train"}


def _snakemake(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(
        [sys.executable, "-m", "snakemake", *args], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env
    )


def test_profile_names_only_rules_of_the_workflow():
    """A misspelt rule name in set-resources would silently run that rule without its GPU."""
    sources = [ROOT / "Snakefile", *sorted((ROOT / "rules").glob("*.smk"))]
    pattern = r"^\s*rule (\w+):|^\s*use rule \w+ as (\w+)"
    rules = {a or b for f in sources for a, b in re.findall(pattern, f.read_text(), re.MULTILINE)}
    profile = yaml.safe_load(PROFILE.read_text())
    assert profile["executor"] == "slurm"
    assert set(profile["set-resources"]) <= rules, set(profile["set-resources"]) - rules
    assert POLICY_RULES <= rules
    for rule in POLICY_RULES | {"testbed_probe"}:
        res = profile["set-resources"][rule]
        assert res["gres"] == "gpu:1" and res["runtime"] > 0 and res["mem_mb"] > 0, rule
    assert "gres" not in profile["default-resources"]


@pytest.mark.slow
def test_dry_run_plans_every_job_with_its_cluster_resources():
    pytest.importorskip("snakemake_executor_plugin_slurm")  # in the test extra: runs in CI
    full = _snakemake("--workflow-profile", "config/slurm", "-n", "results/table1.csv")
    assert full.returncode == 0, full.stderr[-3000:]
    jobs = re.findall(r"^rule (\w+):\n(?:    .*\n)*?    resources: (.*)$", full.stdout + full.stderr, re.MULTILINE)
    by_rule: dict[str, set[str]] = {}
    for rule, resources in jobs:
        by_rule.setdefault(rule, set()).add(resources)
    assert "train" in by_rule and "table1" in by_rule, sorted(by_rule)
    for rule, variants in by_rule.items():
        for resources in variants:
            assert ("gres=gpu:1" in resources) == (rule in POLICY_RULES | {"testbed_probe"}), (rule, resources)
            assert "runtime=" in resources and "mem_mb=" in resources, (rule, resources)


@pytest.mark.slow
def test_verl_runs_ask_the_cluster_for_their_gpus_teacher_included():
    """A verl run's GPUs come from the rule (the student's, plus OPSD's frozen teacher's; Skill-SD's
    teacher is the student, SDFT's lives in the student's workers), not from a fixed gres: the SLURM
    plugin refuses a job that names both."""
    pytest.importorskip("snakemake_executor_plugin_slurm")
    profile = yaml.safe_load(PROFILE.read_text())
    assert "gres" not in profile["set-resources"]["verl_train"]
    out = _snakemake(
        "--workflow-profile", "config/slurm", "-n", "results/real-verl/runs/code/grpo/seed0/summary.json",
        "results/real-verl/runs/code/opsd/seed0/summary.json", "results/real-verl/runs/code/skill_sd/seed0/summary.json",
        "results/real-verl/runs/code/sdft/seed0/summary.json", "--config", "profile=real-verl",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    jobs = re.findall(r"^rule verl_train:\n(?:    .*\n)*?    wildcards: (.*)\n(?:    .*\n)*?    resources: (.*)$",
                      out.stdout + out.stderr, re.MULTILINE)  # fmt: skip
    gpus = {w: re.search(r"\bgpu=(\d+)", r).group(1) for w, r in jobs}
    assert gpus == {
        "domain=code, method=grpo, seed=0": "1",
        "domain=code, method=opsd, seed=0": "2",
        "domain=code, method=sdft, seed=0": "1",
        "domain=code, method=skill_sd, seed=0": "1",
    }, jobs
