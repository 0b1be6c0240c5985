"""Length groups: run rows of very different lengths in separate, less padded forwards.

A padded batch costs its row count times its longest row.  Rollouts differ a lot
in length (code's run from about 150 to 700 tokens, its test reports from about
50 to 300), so one padded forward spends much of its compute on padding.  The
rollout engine's prefill (:class:`methods.core.rollout._Batch`) and the update's
forward (:func:`methods.core.batch.agent_logits`) split such batches with
:func:`length_groups`.
"""

from __future__ import annotations

from collections.abc import Sequence

#: cost of one extra forward call, in padded tokens, when :func:`length_groups` splits a batch
#: (the per-call overhead of a small model on CPU is worth a few dozen tokens of compute)
GROUP_OVERHEAD_TOKENS = 64


def length_groups(lengths: Sequence[int], overhead: int = GROUP_OVERHEAD_TOKENS) -> list[list[int]]:
    """Split rows into groups of similar length, each to be run padded to its own longest row.

    Minimises the padded tokens ``sum(len(group) * max length in group)`` plus
    ``overhead`` per group over every split of the rows sorted by length (longest
    first) into contiguous runs; an exact dynamic programme, O(N^2) for N rows.
    Returns lists of row indices (into ``lengths``), longest group first; one group
    holding every row when splitting saves less than it costs.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    n = len(order)
    best = [0.0] + [float("inf")] * n  # best[j]: cost of the first j sorted rows
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):  # rows i..j-1 form the last group; its longest is row i
            c = best[i] + (j - i) * lengths[order[i]] + overhead
            if c < best[j]:
                best[j], cut[j] = c, i
    groups, j = [], n
    while j > 0:
        groups.append(order[cut[j] : j])
        j = cut[j]
    return groups[::-1]
