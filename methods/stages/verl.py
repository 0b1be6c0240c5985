"""The verl backend's jobs: a job's tasks as verl's parquet files, its main_ppo config, and a finished
verl run as the suite's run files (docs/verl.md).

    python -m methods.cli export-verl  --job JSON --out DIR
    python -m methods.cli verl-config  --job JSON --seed S --model DIR --data DIR --run DIR --out FILE.yaml
    python -m methods.cli verl-run-files --job JSON --method M --seed S --verl-log FILE [FILE ...] \\
        --val-dir DIR --out DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .common import read_job


def cmd_export_verl(args) -> None:
    from methods.verl_backend.export import export_job

    for split, path in export_job(read_job(args.job), args.out).items():
        print(f"[export-verl] {split}: {path}", file=sys.stderr)


def cmd_verl_config(args) -> None:
    from methods.verl_backend.launch import main_ppo_config, validate, write_config

    cfg = main_ppo_config(
        read_job(args.job),
        args.seed,
        model_path=args.model,
        data_dir=args.data,
        run_dir=args.run,
        n_gpus_per_node=args.gpus,
        bank_path=args.bank,
    )
    validate(cfg)
    write_config(cfg, args.out)
    print(f"[verl-config] {args.out}", file=sys.stderr)


def cmd_verl_run_files(args) -> None:
    from methods.verl_backend.metrics import write_run_files

    pre = json.loads(Path(args.bank).with_name("bank.json").read_text())["seed_rollouts"] if args.bank else 0
    summary = write_run_files(
        read_job(args.job), args.method, args.seed, args.verl_log, args.val_dir, args.out, pre_rollouts=pre
    )
    print(
        f"[verl-run-files] {args.out}: final heldout_reward {summary['final']['heldout_reward']:.3f}", file=sys.stderr
    )


def register(sub, job_arg, common) -> None:
    """This stage's commands on the CLI's subparsers (``job_arg``, ``common``: the shared options)."""
    ev = sub.add_parser(
        "export-verl",
        parents=[job_arg],
        help="a job's training split and held-out tasks as verl's RL parquet files (train.parquet, test.parquet)",
    )
    ev.add_argument("--out", required=True, help="output directory")
    ev.set_defaults(fn=cmd_export_verl, threads=1)
    vr = sub.add_parser(
        "verl-run-files",
        parents=[job_arg],
        help="a finished verl run (its file log and validation dumps) as the suite's metrics.jsonl and summary.json",
    )
    vr.add_argument("--method", required=True, help="the method the run trained")
    vr.add_argument("--seed", type=int, required=True, help="the run's seed")
    vr.add_argument(
        "--verl-log",
        required=True,
        nargs="+",
        help="verl's file-logger JSONL (VERL_FILE_LOGGER_PATH), one per attempt of the run (a resume starts a new one)",
    )
    vr.add_argument("--val-dir", required=True, help="verl's trainer.validation_data_dir (<step>.jsonl dumps)")
    vr.add_argument("--out", required=True, help="the run directory to write")
    vr.add_argument(
        "--bank", default=None, help="the seed bank the run read (its bank.json's rollouts enter the ledger)"
    )
    vr.set_defaults(fn=cmd_verl_run_files, threads=1)
    vc = sub.add_parser(
        "verl-config",
        parents=[job_arg],
        help="verl's main_ppo config for a job (composed from verl's ppo_trainer.yaml, checked by verl's validation)",
    )
    vc.add_argument("--seed", type=int, required=True, help="the run's seed")
    vc.add_argument("--model", required=True, help="the policy's save_pretrained directory")
    vc.add_argument("--data", required=True, help="export-verl's directory (train.parquet, test.parquet)")
    vc.add_argument("--run", required=True, help="the verl run's directory (log, validation dumps, checkpoints)")
    vc.add_argument("--gpus", type=int, default=1, help="GPUs of the run's one node")
    vc.add_argument("--bank", default=None, help="the seed experience bank (methods that read one: retrieval_rl)")
    vc.add_argument("--out", required=True, help="the config YAML to write")
    vc.set_defaults(fn=cmd_verl_config, threads=1)
