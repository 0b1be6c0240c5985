"""How often text retrieval finds the task's own group (tool-use environment, code project).

    python benchmarks/probes/probe_retrieval_groups.py [--domains tooluse code] [--bank-tasks 1000] \\
        [--queries 400] [--n 3]
    python benchmarks/probes/probe_retrieval_groups.py --domains tooluse --bank results/small/bank/tooluse/bank.pt

The experience bank embeds each solved training task as "task + trajectory" with
all-MiniLM-L6-v2 and a task retrieves the nearest ones by its own text
(:mod:`methods.experience`).  This probe fills a bank with the scripted
expert's solutions of ``--bank-tasks`` training tasks (the best case of a
seeded bank: every task solved) and reports, over ``--queries`` held-out
tasks, the share of the top-``--n`` items from the query's own group, overall
and over the tasks whose group is in the bank (test-only groups cannot
retrieve their own).  The test bed's check (``docs/testbed.md``) asks >= 0.80
of the real, base-policy-seeded bank; ``results/<profile>/testbed.csv`` measures that.
With ``--bank`` (one domain) it reads such a seeded bank instead and says what
it covers: groups, items per group, and for tool use the share of items whose
solution needs a step a hidden rule demands, against that share among training
tasks (an imperfect policy's successes are biased towards tasks where no rule
fired, and then retrieval rarely shows the rule).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv=None) -> None:
    from methods.experience import BankConfig, ExperienceBank
    from methods.experience.bank import same_group_share
    from methods.experience.encoder import TextEncoder
    from methods.stages.warmstart import expert_episodes
    from tasks.base import get_domain

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--domains", nargs="+", default=["tooluse", "code"])
    p.add_argument("--bank-tasks", type=int, default=1000)
    p.add_argument("--queries", type=int, default=400)
    p.add_argument("--n", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--bank",
        default=None,
        help="a seeded bank.pt (the pipeline's) instead of an expert-filled one; needs one domain",
    )
    a = p.parse_args(argv)
    if a.bank and len(a.domains) != 1:
        p.error("--bank reads one domain's bank: pass one --domains name")
    torch.set_num_threads(a.threads)
    encoder = TextEncoder()
    for name in a.domains:
        domain = get_domain(name, seed=0)
        bank = ExperienceBank(BankConfig(), encoder)
        if a.bank:
            bank.load(a.bank)
            _coverage(domain, bank)
        else:
            bank.add(
                [(e.task, e.turns, e.reward()) for e in expert_episodes(domain, domain.tasks("train", a.bank_tasks))],
                step=-1,
            )
        test = domain.tasks("test", a.queries)
        hits = bank.retrieve(test, a.n)
        groups = {e.group_id for e in bank.items}
        seen = [(t, h) for t, h in zip(test, hits) if t.group_id in groups]
        print(
            f"{name} ({domain.version}): bank {len(bank)} items in {len(groups)} groups; "
            f"top-{a.n} from the task's own group: {same_group_share(test, hits):.3f} of all, "
            f"{same_group_share(*zip(*seen)) if seen else float('nan'):.3f} where the group is in the bank "
            f"({len(seen)}/{len(test)} tasks)"
        )
        domain.close()


def _needs_rule_step(task) -> bool:
    """Tool use: the expert's plan holds more calls than the instruction's intent (+ ``done``)."""
    return len(task.reference.splitlines()) > len(task.payload["intent"]) + 1


def _coverage(domain, bank) -> None:
    import collections

    per_group = collections.Counter(e.group_id for e in bank.items)
    train = domain.tasks("train")
    groups = {t.group_id for t in train}
    counts = sorted(per_group.values())
    print(
        f"{domain.name}: {len(bank)} items cover {len(per_group)}/{len(groups)} training groups; "
        f"items per covered group min {counts[0] if counts else 0}, "
        f"median {counts[len(counts) // 2] if counts else 0}, max {counts[-1] if counts else 0}"
    )
    if domain.name == "tooluse":
        by_id = {t.task_id: t for t in train}
        items = [by_id[e.task_id] for e in bank.items if e.task_id in by_id]
        share = sum(map(_needs_rule_step, items)) / max(len(items), 1)
        print(
            f"tooluse: items whose solution needs a rule step {share:.3f}; "
            f"training tasks {sum(map(_needs_rule_step, train)) / len(train):.3f}"
        )


if __name__ == "__main__":
    main()
