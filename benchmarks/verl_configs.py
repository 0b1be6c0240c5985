"""Check: a verl-backend refactor leaves the generated main_ppo configs unchanged; same SHA-256s pass.

Write every verl-capable method's generated ``main_ppo`` config, and print their SHA-256, so that a
refactor of the verl backend can show its configs unchanged (run it before and after, then ``diff -r``).

    python benchmarks/verl_configs.py --out /tmp/before    # at the old commit
    python benchmarks/verl_configs.py --out /tmp/after     # at the new one
    diff -r /tmp/before /tmp/after && echo identical

Covers each method with a verl path on the ``real-verl`` profile (code) and on ``small`` and ``real``
(code and tool use), with fixed paths (model ``/m``, data ``/d``, run ``/r``, a placeholder seed bank).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROFILES = (("real-verl", ("code",)), ("small", ("code", "tooluse")), ("real", ("code", "tooluse")))


def main(argv: list[str] | None = None) -> None:
    from omegaconf import OmegaConf

    from methods.core.config import resolve_job
    from methods.verl_backend import SUPPORTED_METHODS
    from methods.verl_backend.launch import main_ppo_config

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for the YAML files (one per profile, domain and method)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    bank = Path(tempfile.gettempdir()) / "lopd_bench_verl_configs_bank.pt"  # the same path in every run
    bank.write_text("placeholder: the config names the seed bank's path only")
    for profile, domains in PROFILES:
        for domain in domains:
            for method in SUPPORTED_METHODS:
                job = resolve_job(dict(config, profile=profile), domain, method)
                cfg = main_ppo_config(job, 1, model_path="/m", data_dir="/d", run_dir="/r", bank_path=str(bank))
                text = OmegaConf.to_yaml(cfg)
                (out / f"{profile}-{domain}-{method}.yaml").write_text(text)
                print(f"{profile:10} {domain:8} {method:13} {hashlib.sha256(text.encode()).hexdigest()}")


if __name__ == "__main__":
    main()
