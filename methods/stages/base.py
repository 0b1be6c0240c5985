"""The base policy: the warm start's two stages, and the shipped base policies (install, ship, check).

python -m methods.cli warmstart --job JSON --seed S --out DIR [--threads N]
python -m methods.cli warmstart-stage2 --job JSON --seed S --stage1 DIR --out DIR [--threads N]
python -m methods.cli install-base --job JSON --seed S --shipped DIR --out DIR
python -m methods.cli ship-base    --job JSON --seed S --warmstart DIR --out DIR
python -m methods.cli check-base   --job JSON --seed S --warmstart DIR --shipped DIR --out FILE.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from .common import domain_version, heldout_domain, read_job, save_warm_start


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
    from methods.stages.warmstart import WarmStartConfig, warm_start
    from tasks.base import get_domain

    job = stage1_job(read_job(args.job))
    out = Path(args.out)
    domain = get_domain(job["domain"], seed=job["task_seed"], **job["domain_options"])
    model_cfg = make_config(ModelConfig, job["model"], "model")
    ws_cfg = make_config(WarmStartConfig, job["warmstart"], "warmstart")
    train_cfg = make_config(TrainConfig, job["train"], "train")
    torch.manual_seed(args.seed)
    if model_cfg.checkpoint:  # a real model: its own pretraining is the warm start
        model, tokenizer = load_policy(model_cfg.checkpoint, device=args.device)
        t0 = time.perf_counter()
        heldout = heldout_domain(job) or domain
        report: dict = evaluate(
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
    save_warm_start(out, model, tokenizer, report)
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
    from methods.stages.warmstart import WarmStartConfig
    from methods.stages.warmstart_onpolicy import continue_warm_start
    from tasks.base import get_domain

    job = read_job(args.job)
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
    save_warm_start(out, model, tokenizer, report)
    print(
        f"[warmstart] {job['domain']} seed {args.seed}: heldout_reward {report['heldout_reward']:.3f} "
        f"(stage 1 {stage1['heldout_reward']:.3f}); "
        f"wrote {out / 'model'} and {out / 'eval.json'}",
        file=sys.stderr,
    )


def cmd_install_base(args) -> None:
    """The warm start from a base policy shipped in the repository (see methods/stages/shipped.py)."""
    from methods.stages.shipped import evaluation_differs, install

    job = read_job(args.job)
    try:
        manifest = install(Path(args.shipped), Path(args.out), job, args.seed, domain_version(job))
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
    stage does (:func:`methods.stages.warmstart.warm_start_eval`, same seed), and update its
    ``eval.json``: the held-out and training-split scores are this job's; the context check, which
    the evaluation settings do not touch (the weights and ``warmstart.likelihood_tasks`` match, or
    the base would not have been installed), and the build's own records (``stage1_*``, wall times)
    stay, and ``reevaluated`` says what changed."""
    from methods.core.loop import TrainConfig
    from methods.core.policy import load_policy
    from methods.core.provenance import write_json_atomic
    from methods.core.registry import make_config
    from methods.core.tokenizer import ChatEncoder
    from methods.stages.warmstart import WarmStartConfig, warm_start_eval
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
    from methods.stages.shipped import NOT_DEFINING, ship

    job = read_job(args.job)
    src = Path(args.warmstart)
    recorded = json.loads((src / "eval.json").read_text())

    def settings(j: dict) -> dict:  # the whole job (its evaluation too: eval.json is shipped), not the profile name
        return {k: v for k, v in j.items() if k not in NOT_DEFINING}

    if settings(recorded.get("job") or {}) != settings(job) or recorded.get("seed") != args.seed:
        raise SystemExit(
            f"error: {src} was not built with this job and seed {args.seed}; build it with the pipeline first"
        )
    manifest = ship(src, Path(args.out), job, args.seed, domain_version(job), provenance())
    print(
        f"[ship-base] wrote {args.out} ({len(manifest['files'])} files, "
        f"heldout_reward {manifest['scores'].get('heldout_reward')})",
        file=sys.stderr,
    )


def cmd_check_base(args) -> None:
    """A base policy rebuilt from scratch against the shipped one (writes the comparison as JSON)."""
    from methods.core.provenance import provenance, write_json_atomic
    from methods.stages.shipped import compare

    report = {**compare(Path(args.warmstart), Path(args.shipped)), **provenance()}
    write_json_atomic(Path(args.out), report)
    verdict = "bit-identical" if report["bit_identical"] else f"DIFFERENT: {', '.join(report['model_files_differ'])}"
    print(
        f"[check-base] {args.warmstart} vs {args.shipped}: model files {verdict}; "
        f"scores rebuilt {report['scores_rebuilt']} shipped {report['scores_shipped']}",
        file=sys.stderr,
    )


def register(sub, job_arg, common) -> None:
    """This stage's commands on the CLI's subparsers (``job_arg``, ``common``: the shared options)."""
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
