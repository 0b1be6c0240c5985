"""How often text retrieval finds the task's own group (tool-use environment, code project).

    python benchmarks/probe_retrieval_groups.py [--domains tooluse code] [--bank-tasks 1000] [--queries 400] [--n 3]

The experience bank embeds each solved training task as "task + trajectory" with
all-MiniLM-L6-v2 and a task retrieves the nearest ones by its own text
(:mod:`methods.experience`).  This probe fills a bank with the scripted
expert's solutions of ``--bank-tasks`` training tasks (the best case of a
seeded bank: every task solved) and reports, over ``--queries`` held-out
tasks, the share of the top-``--n`` items from the query's own group, overall
and over the tasks whose group is in the bank (test-only groups cannot
retrieve their own).  The test bed's check (``docs/testbed.md``) asks >= 0.80
of the real, base-policy-seeded bank; ``results/testbed.csv`` measures that.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> None:
    from methods.core.warmstart import expert_episodes
    from methods.experience import BankConfig, ExperienceBank
    from methods.experience.bank import same_group_share
    from methods.experience.encoder import TextEncoder
    from tasks.base import get_domain

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--domains", nargs="+", default=["tooluse", "code"])
    p.add_argument("--bank-tasks", type=int, default=1000)
    p.add_argument("--queries", type=int, default=400)
    p.add_argument("--n", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    encoder = TextEncoder()
    for name in a.domains:
        domain = get_domain(name, seed=0)
        bank = ExperienceBank(BankConfig(), encoder)
        bank.add([(e.task, e.turns, e.reward()) for e in expert_episodes(domain, domain.tasks("train", a.bank_tasks))], step=-1)
        test = domain.tasks("test", a.queries)
        hits = bank.retrieve(test, a.n)
        groups = {e.group_id for e in bank.items}
        seen = [(t, h) for t, h in zip(test, hits) if t.group_id in groups]
        print(f"{name} ({domain.version}): bank {len(bank)} items in {len(groups)} groups; top-{a.n} from the task's own group: "
              f"{same_group_share(test, hits):.3f} of all, {same_group_share(*zip(*seen)) if seen else float('nan'):.3f} where the group is in the bank "
              f"({len(seen)}/{len(test)} tasks)")
        domain.close()


if __name__ == "__main__":
    main()
