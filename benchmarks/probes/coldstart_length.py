"""LOPD's cold start: what its latents give the frozen teacher against the cold start's length.

    python benchmarks/probes/coldstart_length.py --domain tooluse --steps 100 300 1000 \\
        --out results/small/coldstart_length_tooluse.json

One cold start of ``max(--steps)`` steps with the profile's LOPD settings (seed ``--seed``),
from the profile's base policy and seeded bank (``results/<profile>/warmstart``, ``bank``;
the pipeline builds them), with the held-out gains measured after each of ``--steps``
(:func:`methods.lopd.coldstart.cold_start`, ``eval_at``): the learning rate does not
depend on the length, so the numbers after s steps are those of an s-step cold start.
Prints a table (nats/token over no context: latents, the same items as text, the
task's own solution, random latents; on held-out base successes and on expert
actions) and writes the report as JSON.  The reference runs 1,000 steps; the profile
uses the length where the latents stop improving.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> None:
    import yaml

    from methods.core.config import resolve_job
    from methods.core.policy import load_policy
    from methods.core.registry import make_config
    from methods.core.tokenizer import ChatEncoder
    from methods.experience import BankConfig, ExperienceBank
    from methods.experience.encoder import TextEncoder
    from methods.lopd.coldstart import cold_start
    from methods.lopd.method import LOPDConfig, build_composer
    from tasks.base import get_domain

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--domain", required=True)
    p.add_argument("--profile", default="small")
    p.add_argument("--method", default="lopd", help="the run whose LOPD settings to use (a variant's name works)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, nargs="+", default=[100, 300, 1000])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["profile"] = a.profile
    job = resolve_job(config, a.domain, a.method)
    cfg = make_config(LOPDConfig, {**job["method_config"], "cold_start_steps": max(a.steps)}, "lopd")
    base = ROOT / "results" / a.profile
    domain = get_domain(a.domain, seed=job["task_seed"], **job["domain_options"])
    backbone, tok = load_policy(base / "warmstart" / a.domain / "model")
    bank = ExperienceBank(make_config(BankConfig, job["bank"], "bank"), TextEncoder())
    bank.load(base / "bank" / a.domain / "bank.pt")
    composer = build_composer(cfg, backbone, ChatEncoder(tok), a.seed)
    t0 = time.perf_counter()
    rep = cold_start(cfg, composer, bank, domain, a.seed, eval_at=set(a.steps))
    rep.update({"domain": a.domain, "profile": a.profile, "seed": a.seed, "wall_s": round(time.perf_counter() - t0, 1)})
    keys = [f"{p}{c}_gain" for p in ("", "expert_") for c in ("latent", "text", "solution", "random")]
    print("| steps | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for row in [{"step": 0, **rep["before"]}, *rep.get("curve", [])]:
        print(f"| {row['step']} | " + " | ".join(f"{row[k]:+.4f}" for k in keys) + " |")
    print(
        json.dumps({k: rep[k] for k in ("train_examples", "heldout_examples", "train_self_share", "train_s", "wall_s")})
    )
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(rep, indent=2, sort_keys=True) + "\n")
    domain.close()


if __name__ == "__main__":
    main()
