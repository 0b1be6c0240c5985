"""Job entry points called by the Snakemake rules (and usable by hand): a thin dispatcher over the
pipeline's stages (:mod:`methods.stages`), each of which defines its commands beside the code they
run.  ``python -m methods.cli --help`` lists the commands, ``python -m methods.cli COMMAND --help``
a command's settings.

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
    python -m methods.cli retrieved-eval --job JSON --seed S --warmstart DIR --bank FILE --out FILE.json
    python -m methods.cli convert-model --model NAME --out DIR [--gguf FILE]
    python -m methods.cli eval-benchmark --model DIR --domain humaneval --out FILE.json

``--job`` is the resolved job settings (see :func:`methods.core.config.resolve_job`)
as a JSON string or ``@file.json``; the rules pass it so that every result
records exactly what produced it.
"""

from __future__ import annotations

import argparse
import os

import torch

from methods.stages import bank, base, models, train, verl

#: the stages whose commands the CLI offers, in the order ``--help`` lists them
STAGES = (base, bank, train, models, verl)


def shared_options() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The options the commands share: ``--job`` alone, and ``--job`` with seed, output, threads, device."""
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
    return job_arg, common


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m methods.cli", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    job_arg, common = shared_options()
    for stage in STAGES:
        stage.register(sub, job_arg, common)
    return p


def main(argv=None) -> None:
    args = parser().parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    if getattr(args, "device", None) == "auto":
        from methods.core.policy import resolve_device

        args.device = str(resolve_device("auto")[0])  # the jobs keep fp32 weights on either device
    args.fn(args)


if __name__ == "__main__":
    main()
