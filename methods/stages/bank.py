"""The experience bank and the test bed: seeding the bank with the base policy's successes, the base
policy's evaluation with retrieved experience, and the test-bed probe.

    python -m methods.cli bank      --job JSON --seed S --warmstart DIR --out DIR [--threads N]
    python -m methods.cli retrieved-eval --job JSON --seed S --warmstart DIR --bank FILE --out FILE.json
    python -m methods.cli testbed   --job JSON --seed S --warmstart DIR --out FILE.json [--bank FILE] [--n-retrieve N]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from .common import base_eval_of, read_job


def cmd_bank(args) -> None:
    """Seed a domain's experience bank with the warm-start policy's own successes on training tasks."""
    import random

    from methods.core.loop import TrainConfig
    from methods.core.policy import load_policy
    from methods.core.provenance import provenance, write_json_atomic
    from methods.core.registry import make_config
    from methods.core.rollout import run_episodes
    from methods.core.tokenizer import ChatEncoder
    from methods.experience import BankConfig, ExperienceBank
    from methods.experience.encoder import TextEncoder
    from tasks.base import get_domain

    job = read_job(args.job)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bank_cfg = make_config(BankConfig, job["bank"], "bank")
    train_cfg = make_config(TrainConfig, job["train"], "train")
    domain = get_domain(job["domain"], seed=job["task_seed"], **job["domain_options"])
    model, tokenizer = load_policy(Path(args.warmstart) / "model", device=args.device)
    t0 = time.perf_counter()
    train_tasks = domain.tasks("train")
    tasks = random.Random(f"bank/{args.seed}").sample(train_tasks, min(bank_cfg.seed_tasks, len(train_tasks)))
    gen = torch.Generator(device=args.device).manual_seed(args.seed)
    bank = ExperienceBank(bank_cfg, TextEncoder(device=args.device))
    encoder, sampling = ChatEncoder(tokenizer), train_cfg.sampling()

    def play(chunk):
        return run_episodes(model.eval(), encoder, domain, chunk, None, sampling, generator=gen)

    def progress(attempt, tried, of):
        print(
            f"[bank] {job['domain']} seed {args.seed}: attempt {attempt + 1}/{bank_cfg.seed_attempts}, "
            f"{tried}/{of} tasks tried, {len(bank)} in the bank",
            file=sys.stderr,
            flush=True,
        )

    per_attempt = bank.seed(tasks, play, bank_cfg.seed_attempts, progress=progress)
    rollouts, added = sum(per_attempt), len(bank)
    bank.save(out / "bank.pt")
    report = {
        "domain": job["domain"],
        "domain_version": domain.version,
        "seed": args.seed,
        "seed_rollouts": rollouts,
        "seed_rollouts_per_attempt": per_attempt,
        **bank.stats(),
        "success_rate": added / max(rollouts, 1),
        "wall_s": round(time.perf_counter() - t0, 2),
        "job": job,
        **provenance(),
    }
    write_json_atomic(out / "bank.json", report)
    domain.close()
    print(
        f"[bank] {job['domain']} seed {args.seed}: {len(bank)} trajectories from {rollouts} warm-start rollouts; "
        f"wrote {out / 'bank.pt'} and {out / 'bank.json'}",
        file=sys.stderr,
    )


def cmd_testbed(args) -> None:
    """The test-bed probe of a domain's base policy (:mod:`methods.testbed`): its held-out reward
    without context, with the task's reference solution, with retrieved experience."""
    from methods.core.loop import TrainConfig
    from methods.core.policy import load_policy
    from methods.core.provenance import provenance, write_json_atomic
    from methods.core.registry import make_config
    from methods.core.tokenizer import ChatEncoder
    from methods.experience import BankConfig, ExperienceBank
    from methods.experience.encoder import TextEncoder
    from methods.testbed import probe
    from tasks.base import get_domain

    job = read_job(args.job)
    out = Path(args.out)
    train_cfg = make_config(TrainConfig, job["train"], "train")
    domain = get_domain(job["domain"], seed=job["task_seed"], **job["domain_options"])
    model, tokenizer = load_policy(Path(args.warmstart) / "model", device=args.device)
    bank = None
    if args.bank:
        bank = (
            ExperienceBank(make_config(BankConfig, job.get("bank"), "bank"), TextEncoder(device=args.device))
            .load(args.bank)
            .freeze()
        )
    tasks = domain.tasks("test", train_cfg.eval_episodes)
    retrieved = None
    if args.retrieved_eval:
        retrieved = base_eval_of(Path(args.retrieved_eval), job, domain.version)
        if retrieved is None:
            raise SystemExit(
                f"error: {args.retrieved_eval} was not made with this job's held-out tasks and evaluation settings"
            )
    report = probe(
        model,
        ChatEncoder(tokenizer),
        domain,
        tasks,
        train_cfg.sampling(eval=True),
        bank,
        args.n_retrieve,
        args.seed,
        retrieved=retrieved,
    )
    report.update(
        {
            "domain": job["domain"],
            "domain_version": domain.version,
            "seed": args.seed,
            "warmstart": str(args.warmstart),
            "bank": args.bank,
            "job": job,
            **provenance(),
        }
    )
    write_json_atomic(out, report)
    domain.close()
    msg = f"reference +{report['reference_gain']:.3f}" + (
        f", retrieved +{report['retrieval_gain']:.3f} (same group {report['retrieval_same_group']:.2f})"
        if bank is not None
        else ""
    )
    print(
        f"[testbed] {job['domain']}: no context {report['reward_no_context']:.3f} "
        f"(SE {report['reward_no_context_se']:.4f}), {msg}; wrote {out}",
        file=sys.stderr,
    )


def cmd_retrieved_eval(args) -> None:
    """The base policy's held-out evaluation with retrieved experience in context
    (:func:`methods.testbed.retrieved_evaluation`): retrieval RL's rollout-0 evaluation, made once
    per domain, and the test bed's experience check."""
    from methods.core.loop import TrainConfig
    from methods.core.policy import load_policy
    from methods.core.provenance import provenance, write_json_atomic
    from methods.core.registry import make_config
    from methods.core.tokenizer import ChatEncoder
    from methods.experience import BankConfig, ExperienceBank
    from methods.experience.encoder import TextEncoder
    from methods.testbed import retrieved_evaluation
    from tasks.base import get_domain

    job = read_job(args.job)
    out = Path(args.out)
    train_cfg = make_config(TrainConfig, job["train"], "train")
    domain = get_domain(job["domain"], seed=job["task_seed"], **job["domain_options"])
    model, tokenizer = load_policy(Path(args.warmstart) / "model", device=args.device)
    bank = (
        ExperienceBank(make_config(BankConfig, job.get("bank"), "bank"), TextEncoder(device=args.device))
        .load(args.bank)
        .freeze()
    )
    t0 = time.perf_counter()
    tasks = domain.tasks("test", train_cfg.eval_episodes)
    report = retrieved_evaluation(
        model, ChatEncoder(tokenizer), domain, tasks, train_cfg.sampling(eval=True), bank, args.n_retrieve, args.seed
    )
    report.update(
        {
            "domain": job["domain"],
            "domain_version": domain.version,
            "seed": args.seed,
            "warmstart": str(args.warmstart),
            "bank": args.bank,
            "eval_s": round(time.perf_counter() - t0, 2),
            "job": job,
            **provenance(),
        }
    )
    write_json_atomic(out, report)
    domain.close()
    print(
        f"[retrieved-eval] {job['domain']}: held-out reward {report['heldout_reward']:.3f} "
        f"with the top-{args.n_retrieve} retrieved (same group {report['retrieval_same_group']:.2f}); wrote {out}",
        file=sys.stderr,
    )


def register(sub, job_arg, common) -> None:
    """This stage's commands on the CLI's subparsers (``job_arg``, ``common``: the shared options)."""
    bk = sub.add_parser(
        "bank", parents=[common], help="seed an experience bank with the warm start's successes on training tasks"
    )
    bk.add_argument("--warmstart", required=True, help="warm start directory (holds model/)")
    bk.set_defaults(fn=cmd_bank)
    tb = sub.add_parser(
        "testbed",
        parents=[common],
        help=(
            "test-bed probe of a base policy: reward without context, with the reference solution, "
            "with retrieved experience (--out: a JSON file)"
        ),
    )
    tb.add_argument("--warmstart", required=True, help="base policy directory (holds model/)")
    tb.add_argument(
        "--bank", default=None, help="seeded experience bank (bank.pt); without it the experience rows are left out"
    )
    tb.add_argument(
        "--n-retrieve", type=int, default=3, help="retrieved items in the context (retrieval RL's n_retrieve)"
    )
    tb.add_argument(
        "--retrieved-eval",
        default=None,
        help="the domain's retrieved-eval JSON: its per-task rewards are used instead of evaluating again",
    )
    tb.set_defaults(fn=cmd_testbed)
    re_ = sub.add_parser(
        "retrieved-eval",
        parents=[common],
        help=(
            "the base policy's held-out evaluation with the top-n retrieved experiences in context (--out: a JSON file)"
        ),
    )
    re_.add_argument("--warmstart", required=True, help="base policy directory (holds model/)")
    re_.add_argument("--bank", required=True, help="seeded experience bank (bank.pt)")
    re_.add_argument(
        "--n-retrieve", type=int, default=3, help="retrieved items in the context (retrieval RL's n_retrieve)"
    )
    re_.set_defaults(fn=cmd_retrieved_eval)
