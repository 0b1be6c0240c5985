"""What the scale probe's wider base policy costs on this machine, before anyone runs it.

    python benchmarks/probes/scale_probe_cost.py --domain tooluse --steps 60 --threads 1

Builds stage 1 of the warm start (``python -m methods.cli warmstart``, the pipeline's own
entry point) for the ``small`` and the ``small-wide`` profile's model with the profile's
settings, shortened to ``--steps`` SFT steps on ``--demos`` demonstrations and an
evaluation of ``--episodes`` held-out tasks, and reports per profile the parameters, the
seconds per SFT step, and the greedy evaluation's seconds per episode.  From those it
extrapolates the full stage 1 (the profile's ``warmstart.steps``) and the ratio of the
two widths; the on-policy stage and the RL runs scale with the evaluation's rate
(sampling) and the SFT step's (training).  An estimate from measured rates, labelled so.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def measure(profile: str, domain: str, steps: int, demos: int, episodes: int, threads: int) -> dict:
    from methods.cli import main as cli
    from methods.core.config import resolve_job

    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["profile"] = profile
    job = resolve_job(config, domain)
    full_steps = job["warmstart"]["steps"]
    job["warmstart"].update(
        {"steps": steps, "n_demos": demos, "warmup_steps": min(job["warmstart"]["warmup_steps"], steps)}
    )
    job["train"].update({"eval_episodes": episodes, "curve_eval_episodes": None})
    with tempfile.TemporaryDirectory() as out:
        cli(["warmstart", "--job", json.dumps(job), "--seed", "0", "--out", out, "--threads", str(threads)])
        rep = json.loads((Path(out) / "eval.json").read_text())
    eval_s = rep["wall_s"] - rep["sft_s"] - rep["demo_s"]
    return {
        "profile": profile,
        "parameters": rep["parameters"],
        "sft_s_per_step": round(rep["sft_s"] / steps, 3),
        "eval_s_per_episode": round(eval_s / episodes, 4),
        "stage1_sft_estimate_s": round(rep["sft_s"] / steps * full_steps),
        "full_steps": full_steps,
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--domain", default="tooluse")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--demos", type=int, default=4000)
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    rows = [measure(pr, a.domain, a.steps, a.demos, a.episodes, a.threads) for pr in ("small", "small-wide")]
    for r in rows:
        print(json.dumps(r), flush=True)
    small, wide = rows
    print(
        json.dumps(
            {
                "wide_over_small_sft_step": round(wide["sft_s_per_step"] / small["sft_s_per_step"], 2),
                "wide_over_small_eval": round(wide["eval_s_per_episode"] / small["eval_s_per_episode"], 2),
                "note": "stage1_sft_estimate_s extrapolates the measured step time to the profile's warmstart.steps",
            }
        )
    )


if __name__ == "__main__":
    main()
