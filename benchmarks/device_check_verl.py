"""Check: five methods through verl's main_ppo on a GPU (issue 20); every status ok (exit 0) passes.

GPU check of the verl backend (issues 20, 40): GRPO, OPSD, SDFT, SDPO and Skill-SD through verl's ``main_ppo`` for
a few steps with a small model built from a config, and the suite's run files checked complete.

    benchmarks/device_check_verl.sh              # in envs/verl.yaml's environment, on GPUs
    python benchmarks/device_check_verl.py --dry-run --out DIR   # everything up to verl itself (CPU)

Steps, each through the suite's own commands (the ``verl_data`` / ``verl_train`` rules' commands):

1. a small Llama (SmolLM2's tokenizer and chat template, 4 layers of width 256, random weights:
   nothing can be downloaded on a device machine) saved where verl loads it;
2. the ``real-verl`` profile's code job for each method, shrunk to a few steps
   (:data:`SHRINK`), written as JSON;
3. ``export-verl`` (the parquet files), ``verl-config`` (the ``main_ppo`` config, checked by
   verl's own validation);
4. ``python -m verl.trainer.main_ppo`` on it, with the suite's plugin;
5. ``verl-run-files`` and the check that ``analysis/`` accepts the run files: a curve from 0 to
   the budget and a final held-out score.

Every method runs on one GPU: Skill-SD's teacher is the student on its own rollout servers, and
OPSD's (the frozen base), SDFT's and SDPO's (an EMA of the student) are the actor worker's reference
model.
It needs vLLM and Ray (envs/verl.yaml), so the lent machines cannot run it; ``device_check.sh``
checks the EMA teacher on CUDA FSDP without them.  Prints one line per method and
writes ``device_check_verl.json`` under ``--out``.  UNTESTED on a GPU so far: the lent machines
have no vLLM (docs/verl.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
#: the methods checked, in order
METHODS = ("grpo", "opsd", "sdft", "sdpo", "skill_sd")
#: a few steps of the real-verl profile's settings (16 rollouts a step, validation before and after)
SHRINK = {
    "rollout_budget": 32,
    "rollouts_per_step": 16,
    "minibatch_rollouts": 8,
    "eval_every": 32,
    "eval_episodes": 8,
    "max_new_tokens": 128,
    "max_seq_len": 768,
}
#: the small policy: SmolLM2's vocabulary and template, a fraction of its depth and width
SMALL_MODEL = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
}


def build_model(tokenizer_dir: Path, out: Path) -> int:
    """A random-weight model of ``tokenizer_dir``'s architecture (SmolLM2's: Llama), shrunk to
    :data:`SMALL_MODEL`, with its tokenizer and chat template."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(tokenizer_dir)
    for key, value in SMALL_MODEL.items():
        setattr(config, key, value)
    config.head_dim = config.hidden_size // config.num_attention_heads
    if getattr(config, "layer_types", None):  # per-layer attention kinds, one per layer
        config.layer_types = [config.layer_types[0]] * config.num_hidden_layers
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def job_for(method: str) -> dict:
    from methods.core.config import resolve_job

    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    profile = cfg["profiles"]["real-verl"]
    profile["methods"] = [method]
    profile["train"] = dict(profile.get("train", {}), **SHRINK)
    return resolve_job(dict(cfg, profile="real-verl"), "code", method)


def run(cmd: list[str], log: Path, env: dict | None = None) -> None:
    print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    with log.open("a") as f:
        done = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
    if done.returncode:
        tail = "".join(log.read_text().splitlines(keepends=True)[-40:])
        raise SystemExit(f"device_check_verl: {' '.join(cmd[2:4])} failed ({log}):\n{tail}")


def check_method(method: str, out: Path, model: Path, gpus: int, dry_run: bool) -> dict:
    job = job_for(method)
    work = out / method
    shutil.rmtree(work, ignore_errors=True)  # verl resumes from a checkpoint it finds: start clean
    work.mkdir(parents=True)
    job_file = work / "job.json"
    job_file.write_text(json.dumps(job, sort_keys=True))
    log = work / "log.txt"
    py = sys.executable
    cli = [py, "-m", "methods.cli"]
    run([*cli, "export-verl", "--job", f"@{job_file}", "--out", str(work / "data")], log)
    run(
        [*cli, "verl-config", "--job", f"@{job_file}", "--seed", "0", "--model", str(model.resolve()),
         "--data", str((work / "data").resolve()), "--run", str((work / "run").resolve()), "--gpus", str(gpus),
         "--out", str(work / "run" / "main_ppo.yaml")],
        log,
    )  # fmt: skip
    record = {"method": method, "steps": job["train"]["rollout_budget"] // job["train"]["rollouts_per_step"]}
    if dry_run:
        return dict(record, status="configured (dry run: verl not launched)")
    env = dict(
        os.environ,
        PYTHONPATH=f"{ROOT}:{os.environ.get('PYTHONPATH', '')}",
        VERL_USE_EXTERNAL_MODULES="methods.verl_backend.plugin",
        VERL_FILE_LOGGER_PATH=str((work / "run" / "verl.0.jsonl").resolve()),
    )
    t0 = time.perf_counter()
    run(
        [
            py,
            "-m",
            "verl.trainer.main_ppo",
            "--config-path",
            str((work / "run").resolve()),
            "--config-name",
            "main_ppo",
        ],
        log,
        env,
    )
    wall = time.perf_counter() - t0
    run(
        [*cli, "verl-run-files", "--job", f"@{job_file}", "--method", method, "--seed", "0",
         "--verl-log", str(work / "run" / "verl.0.jsonl"), "--val-dir", str(work / "run" / "val"),
         "--out", str(work / "suite")],
        log,
    )  # fmt: skip
    from analysis.runs import check_comparable, eval_points, final_rows

    summary = str(work / "suite" / "summary.json")
    check_comparable(final_rows([], [summary]))
    points = list(eval_points([summary])["rollouts"])
    if points[0] != 0 or points[-1] != job["train"]["rollout_budget"]:
        raise SystemExit(f"device_check_verl: {method}'s curve runs over {points}, not 0 to the budget")
    done = json.loads(Path(summary).read_text())
    # verl's timing_s/step summed: the steps and their checkpoints, not start-up or validation
    train_s = done["ledger"]["wall_s"]
    return dict(
        record,
        status="ok",
        main_ppo_wall_s=round(wall, 1),
        train_s=round(train_s, 1),
        rollouts_per_s=round(job["train"]["rollout_budget"] / max(train_s, 1e-9), 3),
        heldout_reward=done["final"]["heldout_reward"],
        curve_rollouts=points,
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT", "results/device-check-verl"), help="working directory")
    p.add_argument(
        "--tokenizer", default="results/models/smollm2-135m-instruct", help="a model directory with the tokenizer"
    )
    p.add_argument("--dry-run", action="store_true", help="everything up to launching verl (runs on CPU)")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpus = 0
    if not args.dry_run:
        import torch

        gpus = torch.cuda.device_count()
        if gpus == 0:
            raise SystemExit("device_check_verl: no CUDA device (--dry-run checks everything up to verl on CPU)")
        for module in ("verl", "vllm"):
            try:
                __import__(module)
            except ImportError:
                raise SystemExit(f"device_check_verl: {module} is not installed (envs/verl.yaml)") from None
    model = out / "model"
    print(f"device_check_verl: small policy, {build_model(Path(args.tokenizer), model):,} parameters", flush=True)
    records = []
    for method in METHODS:  # each on one GPU (OPSD's frozen teacher is the reference model in the actor worker)
        records.append(check_method(method, out, model, 1, args.dry_run))
        print(f"device_check_verl: {json.dumps(records[-1])}", flush=True)
    (out / "device_check_verl.json").write_text(json.dumps(records, indent=2) + "\n")


if __name__ == "__main__":
    main()
