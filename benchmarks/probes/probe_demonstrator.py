"""What the imperfect demonstrator leaves for RL to find (``docs/testbed.md``).

    python benchmarks/probes/probe_demonstrator.py [--domain tooluse] [--tasks 400] [--recovery 0 0.35 1]

Plays the domain's imperfect demonstrator (``TaskDomain.imperfect_trajectory``)
on warm-start tasks at each recovery probability and prints its mean reward and
success rate beside the scripted expert's: the gap between recovery 0 and 1 is
the most a policy can gain by learning to react to the cue.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv=None) -> None:
    from tasks.base import get_domain

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--domain", default="tooluse")
    p.add_argument("--tasks", type=int, default=400)
    p.add_argument("--recovery", type=float, nargs="+", default=[0.0, 0.35, 1.0])
    a = p.parse_args(argv)
    domain = get_domain(a.domain, seed=0)
    tasks = domain.tasks("warmstart", a.tasks)
    expert = [domain.expert_trajectory(t).reward() for t in tasks]
    print(f"{a.domain}, {len(tasks)} warm-start tasks: expert reward {sum(expert) / len(expert):.3f}")
    for q in a.recovery:
        rng = random.Random(0)
        rewards = [domain.imperfect_trajectory(t, rng, q).reward() for t in tasks]
        print(
            f"  imperfect demonstrator, recovery {q:.2f}: reward {sum(rewards) / len(rewards):.3f}, "
            f"success {sum(r == 1.0 for r in rewards) / len(rewards):.3f}"
        )
    domain.close()


if __name__ == "__main__":
    main()
