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


#: a stand-in for conda that answers what Snakemake asks while it plans (the profile turns conda on; a dry
#: run builds no environment, and the test machines have no conda)
FAKE_CONDA = """#!/bin/sh
case "$1" in
  info) echo '{"conda_prefix": "/nonexistent", "root_prefix": "/nonexistent", "envs_dirs": [], "platform": "linux-64"}';;
  --version) echo "conda 24.11.0";;
  config) echo '{"get": {"channel_priority": "strict"}}';;
  *) echo "fake conda: $*" >&2; exit 1;;
esac
"""  # noqa: E501


def _snakemake(*args: str, fake_conda: Path | None = None) -> subprocess.CompletedProcess:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    if fake_conda is not None:
        fake_conda.mkdir(parents=True, exist_ok=True)
        (fake_conda / "conda").write_text(FAKE_CONDA)
        (fake_conda / "conda").chmod(0o755)
        path = f"{fake_conda}{os.pathsep}{path}"
    return subprocess.run(
        [sys.executable, "-m", "snakemake", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PATH": path},
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
    assert profile["software-deployment-method"] == "conda"  # each rule in its own environment (verl_train: verl's)


@pytest.mark.slow
def test_dry_run_plans_every_job_with_its_cluster_resources(tmp_path):
    pytest.importorskip("snakemake_executor_plugin_slurm")  # in the test extra: runs in CI
    full = _snakemake("--workflow-profile", "config/slurm", "-n", "results/table1.csv", fake_conda=tmp_path / "bin")
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
def test_verl_runs_take_a_whole_node_with_their_gpus_in_verls_environment(tmp_path):
    """A verl run is one SLURM job on one whole node (verl's own SLURM example): the CPUs and memory
    for Ray, the agent-loop workers, vLLM, the FSDP worker and the sandbox, its GPUs from the rule (not
    a fixed gres: the SLURM plugin refuses a job that names both; every method's teacher shares the
    student's GPUs), and envs/verl.yaml as its environment."""
    pytest.importorskip("snakemake_executor_plugin_slurm")
    profile = yaml.safe_load(PROFILE.read_text())
    assert "gres" not in profile["set-resources"]["verl_train"]
    methods = ["grpo", "retrieval_rl", "opsd", "sdft", "skill_sd"]
    out = _snakemake(
        "--workflow-profile", "config/slurm", "-n", "-p",
        *[f"results/real-verl/runs/code/{m}/seed0/summary.json" for m in methods],
        "--config", "profile=real-verl", fake_conda=tmp_path / "bin",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout + out.stderr
    jobs = re.findall(r"^rule verl_train:\n(?:    .*\n)*?    wildcards: (.*)\n(?:    .*\n)*?    resources: (.*)$",
                      text, re.MULTILINE)  # fmt: skip
    assert sorted(w for w, _ in jobs) == sorted(f"domain=code, method={m}, seed=0" for m in methods)
    for wildcards, resources in jobs:
        res = dict(item.split("=", 1) for item in resources.split(", "))
        assert res["gpu"] == "1" and res["nodes"] == "1" and res["slurm_extra"] == "--exclusive", (wildcards, res)
        assert int(res["cpus_per_task"]) >= 16 and int(res["mem_mb"]) >= 128000, (wildcards, res)
    assert "Conda environment envs/verl.yaml will be created." in text  # verl_train's own environment


def test_a_verl_profile_on_two_nodes_is_refused():
    """Nothing starts Ray on a second node, so a profile cannot ask for one (README)."""
    import jsonschema  # what Snakemake's validate(config, "config/schema.yaml") runs

    schema = yaml.safe_load((ROOT / "config" / "schema.yaml").read_text())
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    jsonschema.validate(config, schema)
    config["profiles"]["real-verl"]["backend_options"]["nodes"] = 2
    with pytest.raises(jsonschema.ValidationError, match="'nodes' was unexpected"):
        jsonschema.validate(config, schema)
