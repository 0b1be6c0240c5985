"""Training: a method's cold start before RL, and one run of a method on a domain and seed.

    python -m methods.cli coldstart --job JSON --seed S --warmstart DIR --bank FILE --out DIR [--threads N]
    python -m methods.cli train     --job JSON --seed S --warmstart DIR --out DIR [--bank FILE] [--composer FILE] \\
        [--threads N]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from .common import base_eval_of, heldout_domain, read_job


def _fingerprint(job: dict, args) -> str:
    """What a train checkpoint must match to be resumed: settings, seed, warm start, code."""
    import hashlib

    from methods.core.provenance import git_commit

    h = hashlib.sha256(json.dumps(job, sort_keys=True).encode())
    h.update(str(args.seed).encode())
    ws_eval = Path(args.warmstart) / "eval.json"
    h.update(ws_eval.read_bytes() if ws_eval.exists() else b"")
    h.update(git_commit()["commit"].encode())
    return h.hexdigest()


def cmd_coldstart(args) -> None:
    """A method's cold start (``needs_cold_start``; LOPD's composer): the component its runs
    start from, trained before RL on the base policy (and its seeded bank, for a method that
    reads one)."""
    from dataclasses import asdict

    from methods.core.policy import load_policy
    from methods.core.provenance import provenance, write_json_atomic
    from methods.core.registry import get_method, make_config
    from methods.core.tokenizer import ChatEncoder
    from tasks.base import get_domain

    job = read_job(args.job)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cls = get_method(job["method"])
    if not cls.needs_cold_start:
        raise SystemExit(f"error: method {job['method']} has no cold start (needs_cold_start is False)")
    cfg = make_config(cls.Config, job["method_config"], f"methods.{job.get('run_name', job['method'])}")
    if cfg.cold_start_key() is None:
        raise SystemExit(
            f"error: {job.get('run_name', job['method'])} needs no cold start (its cold_start_key is None)"
        )
    domain = get_domain(job["domain"], seed=job["task_seed"], **job["domain_options"])
    backbone, tokenizer = load_policy(Path(args.warmstart) / "model", device=args.device)
    encoder = ChatEncoder(tokenizer)
    bank = None
    if cls.uses_bank:
        if not args.bank or not Path(args.bank).exists():
            raise SystemExit(
                f"error: method {job['method']} reads an experience bank: --bank bank.pt is required, got {args.bank!r}"
            )
        from methods.experience import BankConfig, ExperienceBank
        from methods.experience.encoder import TextEncoder

        bank = ExperienceBank(make_config(BankConfig, job["bank"], "bank"), TextEncoder(device=args.device))
        bank.load(args.bank)
    state, report = cls.cold_start(
        cfg, backbone=backbone, encoder=encoder, bank=bank, domain=domain, seed=args.seed, device=args.device
    )
    tmp = out / "composer.pt.tmp"
    torch.save({**state, "config": asdict(cfg), "report": report}, tmp)
    tmp.replace(out / "composer.pt")
    report.update(
        {
            "domain": job["domain"],
            "domain_version": domain.version,
            "seed": args.seed,
            "cold_start_key": cfg.cold_start_key(),
            "job": job,
            **provenance(),
        }
    )
    write_json_atomic(out / "coldstart.json", report)
    domain.close()
    print(
        f"[coldstart] {job['method']} {job['domain']} seed {args.seed}: "
        f"wrote {out / 'composer.pt'} and {out / 'coldstart.json'}",
        file=sys.stderr,
    )


def _run_context(job: dict, args, cls, train_cfg, domain):
    """The run a training job starts: the base policy on its device, the ledger, the held-out
    benchmark, the seeded bank where the method reads one, and the stored evaluations of the base
    policy on this job's held-out tasks that the run may reuse (its cold start: :func:`cmd_train`)."""
    from methods.core.ledger import Ledger
    from methods.core.loop import RunContext
    from methods.core.policy import load_policy
    from methods.core.tokenizer import ChatEncoder

    model, tokenizer = load_policy(Path(args.warmstart) / "model", device=args.device)
    run = RunContext(
        model=model,
        tokenizer=tokenizer,
        encoder=ChatEncoder(tokenizer),
        domain=domain,
        train_cfg=train_cfg,
        ledger=Ledger(train_cfg.rollout_budget),
        seed=args.seed,
        device=torch.device(args.device),
        warmstart_path=Path(args.warmstart),
        out_dir=Path(args.out),
        heldout_domain=heldout_domain(job),
    )
    if cls.uses_bank:
        if "bank" not in job:
            raise SystemExit(f"method {job['method']} reads an experience bank, but the job has no bank settings")
        run.bank_config = job["bank"]
        if job["bank"]["seed_tasks"] > 0:
            if not args.bank or not Path(args.bank).exists():
                raise SystemExit(
                    f"method {job['method']}: bank.seed_tasks is {job['bank']['seed_tasks']}, "
                    f"so a seeded bank is required (--bank); got {args.bank!r}. "
                    "Run `python -m methods.cli bank` first."
                )
            run.bank_path = args.bank
            run.ledger.pre_rollouts = json.loads(Path(args.bank).with_name("bank.json").read_text())["seed_rollouts"]
    base = base_eval_of(Path(args.warmstart) / "eval.json", job, domain.version)
    if base is not None:
        run.base_eval = base
    for path in args.context_eval or []:
        ev = base_eval_of(Path(path), job, domain.version)
        if ev is None:
            print(
                f"note: {path} is not an evaluation of this job's held-out tasks and settings; not reused",
                file=sys.stderr,
            )
        elif Path(ev.get("warmstart", "")).resolve() != Path(args.warmstart).resolve():
            print(f"note: {path} evaluated another base policy ({ev.get('warmstart')}); not reused", file=sys.stderr)
        else:
            run.context_evals.append(ev)
    return run


def cmd_train(args) -> None:
    from methods.core.loop import TrainConfig, train
    from methods.core.provenance import provenance, write_json_atomic
    from methods.core.registry import get_method, make_config
    from tasks.base import get_domain

    job = read_job(args.job)
    out = Path(args.out)
    cls = get_method(job["method"])
    method_cfg = make_config(cls.Config, job["method_config"], f"methods.{job['method']}")
    train_cfg = make_config(TrainConfig, job["train"], "train")
    domain = get_domain(job["domain"], seed=job["task_seed"], **job["domain_options"])
    run = _run_context(job, args, cls, train_cfg, domain)
    if cls.needs_cold_start and method_cfg.cold_start_key() is not None:
        if not args.composer or not Path(args.composer).exists():
            raise SystemExit(
                f"method {job['method']} starts from a cold-started composer (--composer composer.pt); "
                f"got {args.composer!r}. Run `python -m methods.cli coldstart` first."
            )
        run.cold_start_path = args.composer
    method = cls(method_cfg, run)
    name = job.get("run_name", job["method"])
    label = f"{name} {job['domain']} s{args.seed}"
    final = train(method, run, out, label=label, fingerprint=_fingerprint(job, args))
    summary = {
        "domain": job["domain"],
        "domain_version": domain.version,
        "method": name,
        "seed": args.seed,
        "final": final,
        "ledger": run.ledger.snapshot(),
        "job": job,
        "warmstart": str(args.warmstart),
        **provenance(),
    }
    if run.heldout_domain is not None:
        summary["heldout_domain_version"] = run.heldout_domain.version
        run.heldout_domain.close()
    if run.device.type == "cuda":  # GPU memory the run needed (this process's peak; benchmarks/device_check.sh)
        summary["cuda_peak_memory_gib"] = round(torch.cuda.max_memory_allocated(run.device) / 2**30, 3)
    write_json_atomic(out / "summary.json", summary)
    domain.close()
    print(
        f"[{label}] done: heldout_reward {final['heldout_reward']:.3f} after {run.ledger.rollouts} rollouts; "
        f"wrote {out / 'metrics.jsonl'} and {out / 'summary.json'}",
        file=sys.stderr,
    )


def register(sub, job_arg, common) -> None:
    """This stage's commands on the CLI's subparsers (``job_arg``, ``common``: the shared options)."""
    tr = sub.add_parser("train", parents=[common], help="train one method on one domain and seed")
    tr.add_argument("--warmstart", required=True, help="warm start directory (holds model/)")
    tr.add_argument("--bank", default=None, help="seeded experience bank (bank.pt) for methods that read one")
    tr.add_argument(
        "--composer",
        default=None,
        help="the cold start's file (composer.pt) for a method with needs_cold_start (LOPD and its variants)",
    )
    tr.add_argument(
        "--context-eval",
        action="append",
        help="an evaluation of the base policy with contexts (retrieved-eval's JSON), reused at rollout 0 "
        "where the method's student contexts are exactly those (repeatable)",
    )
    tr.set_defaults(fn=cmd_train)
    cs = sub.add_parser(
        "coldstart",
        parents=[common],
        help="a method's cold start before RL (LOPD: the composer, on the warm start's own successes)",
    )
    cs.add_argument("--warmstart", required=True, help="warm start directory (holds model/)")
    cs.add_argument("--bank", default=None, help="seeded experience bank (bank.pt), for a method that reads one")
    cs.set_defaults(fn=cmd_coldstart)
