"""Benchmark: how the base policy's size and training budget move the test-bed checks.

For each variant (overrides of the profile's ``model`` and the domain's ``warmstart``
settings) it builds the base policy exactly as the pipeline does (``methods.cli
warmstart`` then ``warmstart-stage2``), runs the test-bed probe without a bank (reward
without context and with the task's reference solution) and GRPO on ``--seeds`` at the
profile's settings, and for the code domain classifies the base policy's greedy
first programs on held-out tasks of seen projects: right, right program with the wrong
conventions (``wrong_conv``), or a wrong program (``core_wrong``).  Variants and seeds run
as parallel processes (give each a core, or a GPU with ``--device cuda``); a deadline
(``--budget-s``) skips what would not finish, and whatever finished is summarized.

    python benchmarks/probes/base_size_sweep.py --domain code --device cuda --out /tmp/sweep \\
        --variant c128x2 '{"model": {"hidden_size": 128, "num_layers": 2}}' \\
        --variant c512x4 '{"model": {"hidden_size": 512, "num_layers": 4, "num_heads": 8, "intermediate_size": 2048}}'

Writes ``OUT/summary.json`` (and prints it).  GPU numbers are not bit-identical to the
CPU's; the small profile's base policies are built on the CPU.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import copy
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

EVAL_KEYS = (
    "heldout_reward",
    "heldout_reward_se",
    "train_reward",
    "parameters",
    "demo_s",
    "sft_s",
    "wall_s",
    "final_nll",
    "context_gain_own_solution",
    "context_gain_same_group",
)


def write_jobs(config: dict, domain: str, name: str, overrides: dict, out: Path) -> dict[str, Path]:
    from methods.core.config import resolve_job, stage1_job

    cfg = copy.deepcopy(config)
    prof = cfg["profiles"][cfg["profile"]]
    prof["model"] = {**prof["model"], **overrides.get("model", {})}
    dom = prof.setdefault("domain_overrides", {}).setdefault(domain, {})
    dom["warmstart"] = {**dom.get("warmstart", {}), **overrides.get("warmstart", {})}
    prof["domain_options"] = {**prof.get("domain_options", {}), **overrides.get("domain_options", {})}
    jobs = {
        "stage1": stage1_job(resolve_job(cfg, domain)),
        "base": resolve_job(cfg, domain),
        "grpo": resolve_job(cfg, domain, "grpo"),
    }
    paths = {}
    for key, job in jobs.items():
        paths[key] = out / name / f"job_{key}.json"
        paths[key].parent.mkdir(parents=True, exist_ok=True)
        paths[key].write_text(json.dumps(job, sort_keys=True))
    return paths


def classify_code(model_dir: Path, device: str, n: int) -> dict:
    """The base policy's greedy first program on held-out tasks of seen projects, matched on probe
    inputs against the task's program under every convention set of size <= 2."""
    import torch

    from methods.core.policy import load_policy
    from methods.core.rollout import SamplingConfig, run_episodes
    from methods.core.tokenizer import ChatEncoder
    from tasks.base import get_domain
    from tasks.code import CONVENTIONS, TEMPLATES, extract_program
    from tasks.code.families import render_reference
    from tasks.code.generator import _call, _compile, _probes

    model, tok = load_policy(model_dir, device=device)
    dom = get_domain("code", 0, system_prompt=False, attempts=1)
    tasks = [t for t in dom.tasks("test", n) if not t.payload["test_only_project"]]
    rolls = run_episodes(
        model,
        ChatEncoder(tok),
        dom,
        tasks,
        None,
        SamplingConfig(temperature=0.0, max_new_tokens=96),
        generator=torch.Generator(device=device).manual_seed(0),
    )
    templates = {t.name: t for t in TEMPLATES}
    sets = [()] + [(c,) for c in CONVENTIONS] + list(itertools.combinations(CONVENTIONS, 2))
    out = {"tasks": len(tasks), "right": 0, "wrong_conv": 0, "core_wrong": 0, "no_program": 0}
    for task, roll in zip(tasks, rolls):
        tmpl, ns = templates[task.template_id], {}
        try:
            exec(extract_program(roll.episode.turns[0].action), ns)  # noqa: S102 -- our own analysis of the policy's output, in a throwaway namespace
            got = [_call(ns["f"], x) for x in _probes(tmpl.arg)]
        except Exception:
            out["no_program"] += 1
            continue
        match = next(
            (
                s
                for s in sets
                if got
                == [_call(_compile(render_reference(tmpl, task.payload["params"], s)), x) for x in _probes(tmpl.arg)]
            ),
            None,
        )
        out[
            "core_wrong"
            if match is None
            else "right"
            if set(match) == set(task.payload["conventions"])
            else "wrong_conv"
        ] += 1
    dom.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--domain", default="code")
    ap.add_argument(
        "--variant",
        nargs=2,
        action="append",
        metavar=("NAME", "JSON"),
        required=True,
        help="name and overrides {model: ..., warmstart: ..., domain_options: ...}",
    )
    ap.add_argument("--config", default=str(ROOT / "config" / "config.yaml"))
    ap.add_argument("--profile", default="small")
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2], help="GRPO seeds")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--budget-s", type=float, default=3600.0, help="skip steps that would start after this many seconds"
    )
    ap.add_argument("--classify-tasks", type=int, default=1000)
    a = ap.parse_args()
    deadline = time.time() + a.budget_s
    config = yaml.safe_load(open(a.config))
    config["profile"] = a.profile
    out = Path(a.out)

    def run(cmd: list[str], log: Path):
        left = deadline - time.time()
        if left < 20:
            return "skipped (deadline)"
        with open(log, "w") as f:
            try:
                return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=left, cwd=ROOT).returncode
            except subprocess.TimeoutExpired:
                return "timeout"

    def cli(*args) -> list[str]:
        return [sys.executable, "-m", "methods.cli", *args, "--device", a.device, "--threads", "1"]

    def variant(item) -> tuple[str, dict]:
        name, overrides = item
        jobs, d = write_jobs(config, a.domain, name, json.loads(overrides), out), out / name
        st = {
            "stage1": run(
                cli("warmstart", "--job", f"@{jobs['stage1']}", "--seed", "0", "--out", str(d / "stage1")),
                d / "stage1.log",
            )
        }
        st["base"] = run(
            cli(
                "warmstart-stage2",
                "--job",
                f"@{jobs['base']}",
                "--seed",
                "0",
                "--stage1",
                str(d / "stage1"),
                "--out",
                str(d / "base"),
            ),
            d / "base.log",
        )
        todo = {
            f"grpo{s}": cli(
                "train",
                "--job",
                f"@{jobs['grpo']}",
                "--seed",
                str(s),
                "--warmstart",
                str(d / "base"),
                "--out",
                str(d / f"grpo/seed{s}"),
            )
            for s in a.seeds
        }
        todo["probe"] = cli(
            "testbed",
            "--job",
            f"@{jobs['base']}",
            "--seed",
            "0",
            "--warmstart",
            str(d / "base"),
            "--out",
            str(d / "probe.json"),
        )
        with cf.ThreadPoolExecutor(len(todo)) as ex:
            st.update(
                {k: f.result() for k, f in {k: ex.submit(run, c, d / f"{k}.log") for k, c in todo.items()}.items()}
            )
        return name, st

    with cf.ThreadPoolExecutor(len(a.variant)) as ex:
        status = dict(ex.map(variant, a.variant))
    summary: dict = {"domain": a.domain, "device": a.device, "status": status}
    for name, _ in a.variant:
        d, s = out / name, summary.setdefault(name, {})
        for stage in ("stage1", "base"):
            if (d / stage / "eval.json").exists():
                e = json.loads((d / stage / "eval.json").read_text())
                s[stage] = {k: e.get(k) for k in EVAL_KEYS}
        for seed in a.seeds:
            m = d / f"grpo/seed{seed}/metrics.jsonl"
            if m.exists():
                s[f"grpo_seed{seed}"] = [
                    (r["rollouts"], r["heldout_reward"])
                    for r in map(json.loads, m.read_text().splitlines())
                    if r.get("kind") == "eval"
                ]
        if (d / "probe.json").exists():
            p = json.loads((d / "probe.json").read_text())
            s["probe"] = {k: p.get(k) for k in ("reward_no_context", "reward_reference", "reference_gain", "probe_s")}
        if a.domain == "code" and a.classify_tasks and (d / "base" / "model").is_dir():
            s["greedy_first_program"] = classify_code(d / "base" / "model", a.device, a.classify_tasks)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
