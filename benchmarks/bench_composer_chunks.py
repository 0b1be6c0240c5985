"""No stated target: measures LOPD's composer time by chunk size; the fastest chunk with max_abs_diff ~0 wins.

LOPD's composer: forward + backward time of one step's retrieved items by chunk size, and
how far the chunked latents are from one batch of all items.

    python benchmarks/bench_composer_chunks.py --domain code --items 96

Items are "Task to solve / Reference past trajectory" texts built from the seeded bank of
``results/<profile>/bank/<domain>`` (random task and trajectory pairs), encoded by a
composer on the domain's base policy, as one LOPD step encodes J=3 items for each of 32 rollouts.
Prints one JSON line: the item lengths, the best of ``--repeats`` wall times per chunk size,
and the largest absolute difference of each chunking's latents from the one-batch latents.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> None:
    from methods.core.policy import load_policy
    from methods.core.tokenizer import ChatEncoder
    from methods.lopd.composer import item_text
    from methods.lopd.method import LOPDConfig, build_composer

    p = argparse.ArgumentParser(
        prog="python benchmarks/bench_composer_chunks.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--domain", required=True)
    p.add_argument("--seed", type=int, default=0, help="the composer's initialisation seed")
    p.add_argument("--profile", default="small")
    p.add_argument("--items", type=int, default=96, help="items per step (J x rollouts per step)")
    p.add_argument("--chunks", type=int, nargs="+", default=[96, 32, 16, 8, 4])
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    base = ROOT / "results" / a.profile
    model, tok = load_policy(base / "warmstart" / a.domain / "model")  # the domain's one base policy
    composer = build_composer(LOPDConfig(), model, ChatEncoder(tok), a.seed)
    items = torch.load(base / "bank" / a.domain / "bank.pt", weights_only=False)["items"]
    if not items:
        p.error("the bank is empty")
    rng = random.Random(0)
    ids = composer.encode_items(
        [item_text(rng.choice(items)["task_text"], rng.choice(items)["trace"]) for _ in range(a.items)]
    )
    with torch.no_grad():
        one = composer(ids, chunk_items=len(ids))
    row = {
        "domain": a.domain,
        "items": len(ids),
        "item_tokens": {
            "min": min(map(len, ids)),
            "mean": round(sum(map(len, ids)) / len(ids), 1),
            "max": max(map(len, ids)),
        },
        "seconds": {},
        "max_abs_diff": {},
    }
    for chunk in a.chunks:
        times = []
        for _ in range(a.repeats):
            composer.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            lat = composer(ids, chunk_items=chunk)
            lat.pow(2).mean().backward()
            times.append(time.perf_counter() - t0)
        row["seconds"][chunk] = round(min(times), 3)
        row["max_abs_diff"][chunk] = float((lat.detach() - one).abs().max())
    print(json.dumps(row))


if __name__ == "__main__":
    main()
