"""Diagnostic: what a (warm-started or trained) policy can and cannot do.

Prints one JSON object with, on the held-out split:

* greedy reward with no context, with a solved *training* task of the same
  group (environment variant / project) as a context block -- what retrieval
  hands a student or teacher -- and with the task's own reference solution --
  what OPSD, SDPO and SDFT hand a teacher.  A privileged-context method has
  something to distil only where a context raises the reward;
* reward on seen groups vs groups that appear only in the test split;
* for tool use, the first error of each failed greedy episode, by kind;

and, on the training split, the reward of rollouts sampled at a few
temperatures (the signal an RL method starts from).

    python benchmarks/probes/probe_policy.py --domain tooluse --model results/small/warmstart/tooluse/model
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import re
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def error_kind(obs: str) -> str:
    """A coarse class of a tool-use error observation."""
    text = obs[len("error:") :].strip().lower()
    for key, pat in (
        ("hidden rule broken", r"needs .* first|amounts are in cents"),
        ("unknown tool", r"^unknown tool"),
        ("wrong arity", r"^use "),
        ("bad id format", r"^ids look like"),
        ("unknown entity or name", r"^no \w+ |^unknown |^bad name"),
        ("malformed call", r"expected name|unbalanced|unclosed|empty|no \( \)"),
        ("bad value", r"must be|is only|balance must|days are|shelves are|is booked|is out|is not out"),
        ("entity already closed/cancelled/gone", r" is (closed|cancelled|gone)$"),
    ):
        if re.search(pat, text):
            return key
    return "other"


def is_new_group(task) -> bool:
    """Whether ``task``'s group (environment variant / project) never occurs in the train split."""
    if task.domain == "code":
        return bool(task.payload["test_only_project"])
    from tasks.tooluse.variants import N_TRAIN_VARIANTS

    return task.payload["variant"] >= N_TRAIN_VARIANTS


def main(argv=None) -> None:
    from tasks.base import get_domain

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--domain", required=True)
    p.add_argument("--model", required=True, help="a save_pretrained directory")
    p.add_argument("--episodes", type=int, default=200, help="held-out tasks")
    p.add_argument("--train-episodes", type=int, default=256, help="training tasks for the temperature sweep")
    p.add_argument("--temperatures", type=float, nargs="*", default=[1.0, 0.7, 0.5])
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: 32 (tool use) / 96 (code)")
    p.add_argument(
        "--system-prompt", action="store_true", help="the domain option system_prompt (the small profile has it off)"
    )
    p.add_argument("--task-seed", type=int, default=0, help="the config's task_seed")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    domain = get_domain(a.domain, seed=a.task_seed, system_prompt=a.system_prompt)
    try:
        print(json.dumps(probe(domain, a), indent=1))
    finally:
        domain.close()


def probe(domain, a) -> dict:
    from methods.core.evaluate import summarize
    from methods.core.policy import load_policy
    from methods.core.rollout import SamplingConfig, run_episodes
    from methods.core.tokenizer import ChatEncoder
    from methods.stages.warmstart import expert_episodes
    from tasks.base import format_trace

    model, tok = load_policy(a.model)
    enc = ChatEncoder(tok)
    mnt = a.max_new_tokens or (32 if a.domain == "tooluse" else 96)
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=mnt)
    gen = torch.Generator().manual_seed(0)
    rng = random.Random("probe")

    test = domain.tasks("test", a.episodes)
    train_by_group: dict[str, list] = collections.defaultdict(list)
    for e in expert_episodes(domain, domain.tasks("train", 2000)):
        train_by_group[e.task.group_id].append(e)
    # the same-group condition is scored on seen groups only (a new group has no training task)
    same_ctx = [
        format_trace((ex := rng.choice(train_by_group[t.group_id])).task, ex.turns)
        if train_by_group.get(t.group_id)
        else None
        for t in test
    ]
    own = {e.task.task_id: e for e in expert_episodes(domain, test)}
    own_ctx = [format_trace(t, own[t.task_id].turns, with_task=False) for t in test]
    out: dict = {"domain": a.domain, "model": a.model, "heldout_tasks": len(test)}
    for name, ctxs in (("none", None), ("same_group", same_ctx), ("own_solution", own_ctx)):
        rolls = run_episodes(model, enc, domain, test, ctxs, greedy, generator=gen)
        seen = [r.reward for r, t in zip(rolls, test) if not is_new_group(t) and t.group_id in train_by_group]
        new = [r.reward for r, t in zip(rolls, test) if is_new_group(t)]
        if name != "same_group":
            out[f"greedy_reward_{name}_context"] = round(sum(r.reward for r in rolls) / len(rolls), 4)
            out[f"greedy_reward_{name}_context_new_groups"] = round(sum(new) / max(len(new), 1), 4)
        out[f"greedy_reward_{name}_context_seen_groups"] = round(sum(seen) / max(len(seen), 1), 4)
        if name == "none":
            out["heldout_seen_group_tasks"], out["heldout_new_group_tasks"] = len(seen), len(new)
            out.update({k: round(v, 4) for k, v in summarize(rolls, prefix="greedy_").items()})
            if a.domain == "tooluse":
                kinds = collections.Counter()
                for r in rolls:
                    if r.reward < 1.0:
                        errs = getattr(r.episode, "errors", [])
                        kinds[error_kind(errs[0]) if errs else "no error (wrong or missing calls)"] += 1
                out["first_error_of_failed_episodes"] = dict(kinds.most_common())
                out["example_errors"] = sorted({e for r in rolls for e in getattr(r.episode, "errors", [])[:1]})[:12]
    train = domain.tasks("train", a.train_episodes)
    for temp in a.temperatures:
        rolls = run_episodes(
            model, enc, domain, train, None, SamplingConfig(temperature=temp, max_new_tokens=mnt), generator=gen
        )
        out[f"train_reward_T{temp}"] = round(sum(r.reward for r in rolls) / len(rolls), 4)
    rolls = run_episodes(model, enc, domain, train, None, greedy, generator=gen)
    out["train_reward_greedy"] = round(sum(r.reward for r in rolls) / len(rolls), 4)
    return out


if __name__ == "__main__":
    main()
