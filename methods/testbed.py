"""Test-bed probe: does the base policy have what the compared methods rely on?

A comparison can only separate methods if its test bed lets each mechanism
work (``docs/testbed.md``).  This probe measures, on the profile's own held-out
tasks and evaluation protocol (the same tasks, greedy decoding and seed as the
Vanilla evaluation), three of the four checks of ``results/<profile>/testbed.csv``:

* **privileged information is usable** (OPSD's and SDFT's premise): the base
  policy's reward with the task's own reference solution in its context (the
  scripted expert's trace, exactly the context OPSD's teacher gets,
  :func:`methods.core.distill.expert_trace`) minus its reward without;
* **experience is usable** (retrieval RL's and LOPD's premise): its reward with
  the top-``n_retrieve`` successes retrieved from the domain's seeded
  experience bank in its context (exactly retrieval RL's student context at
  rollout 0, :func:`methods.retrieval_rl.render_experience`) minus its reward
  without, and the share of retrieved items from the task's own group
  (environment variant / project);
* **evaluations are precise**: the standard error of the mean held-out reward
  of one evaluation.

Each gain comes with the standard error of the paired per-task difference.
The fourth check, transferable headroom (GRPO's gain over the base policy),
needs the GRPO runs and is computed by :mod:`analysis.testbed`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from methods.core.distill import expert_trace
from methods.core.evaluate import contexts_fingerprint, mean_se, summarize
from methods.core.rollout import SamplingConfig, run_episodes
from methods.core.tokenizer import ChatEncoder
from methods.experience.bank import ExperienceBank, same_group_share
from methods.retrieval_rl import render_experience
from tasks.base import Task, TaskDomain

__all__ = ["mean_se", "paired_gain", "probe", "retrieved_evaluation"]


def paired_gain(with_ctx: Sequence[float], without: Sequence[float]) -> tuple[float, float]:
    """Mean per-task difference ``with_ctx - without`` and its standard error."""
    if len(with_ctx) != len(without) or not with_ctx:
        raise ValueError(f"paired_gain needs paired rewards, got {len(with_ctx)} and {len(without)}")
    return mean_se([a - b for a, b in zip(with_ctx, without)])


def _rollouts(model, encoder, domain, tasks, contexts, sampling, seed):
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    return run_episodes(model, encoder, domain, tasks, contexts, sampling, generator=gen)


def _rewards(model, encoder, domain, tasks, contexts, sampling, seed) -> list[float]:
    return [r.reward for r in _rollouts(model, encoder, domain, tasks, contexts, sampling, seed)]


@torch.no_grad()
def retrieved_evaluation(
    model,
    encoder: ChatEncoder,
    domain: TaskDomain,
    tasks: Sequence[Task],
    sampling: SamplingConfig,
    bank: ExperienceBank,
    n_retrieve: int,
    seed: int,
) -> dict:
    """The base policy's held-out evaluation with the top-``n_retrieve`` experiences of ``bank`` in
    its context: the same computation as a retrieval RL run's evaluation at rollout 0 (its
    student's contexts come from the same seeded bank, whatever the run's seed), so such runs
    reuse it (``contexts_sha256``, :func:`methods.core.loop._base_eval`) and the test bed's
    experience check reads it.  ``heldout_*`` as :func:`methods.core.evaluate.evaluate` gives
    them, ``rewards`` per task, and what was retrieved."""
    was_training = model.training
    model.eval()
    hits = bank.retrieve(list(tasks), n_retrieve)
    contexts = [render_experience(h) for h in hits]
    rollouts = _rollouts(model, encoder, domain, tasks, contexts, sampling, seed)
    model.train(was_training)
    return {
        **summarize(rollouts),
        "heldout_episodes": len(rollouts),
        "rewards": [r.reward for r in rollouts],
        "contexts_sha256": contexts_fingerprint(tasks, contexts, sampling),
        "n_retrieve": n_retrieve,
        "bank_size": len(bank),
        "retrieved_per_task": sum(len(h) for h in hits) / max(len(hits), 1),
        "retrieval_same_group": same_group_share(tasks, hits),
        "retrieval_same_group_seen": _seen_share(tasks, hits, bank),
        "bank_group_coverage": _group_coverage(tasks, bank),
    }


@torch.no_grad()
def probe(
    model,
    encoder: ChatEncoder,
    domain: TaskDomain,
    tasks: Sequence[Task],
    sampling: SamplingConfig,
    bank: ExperienceBank | None,
    n_retrieve: int,
    seed: int,
    retrieved: dict | None = None,
) -> dict:
    """The base policy's held-out reward without context, with the task's reference solution and
    with retrieved experience, on ``tasks`` (the Vanilla evaluation's).  The last comes from
    ``retrieved`` when given (:func:`retrieved_evaluation` of the same tasks, made once per
    domain), else it is evaluated with ``bank``; with neither, the experience rows are left out
    (a profile whose methods use no bank)."""
    was_training = model.training
    model.eval()
    t0 = time.perf_counter()
    none = _rewards(model, encoder, domain, tasks, None, sampling, seed)
    ref = _rewards(model, encoder, domain, tasks, [expert_trace(domain, t) for t in tasks], sampling, seed)
    base, base_se = mean_se(none)
    ref_mean, _ = mean_se(ref)
    gain, gain_se = paired_gain(ref, none)
    out = {
        "episodes": len(tasks),
        "reward_no_context": base,
        "reward_no_context_se": base_se,
        "reward_reference": ref_mean,
        "reference_gain": gain,
        "reference_gain_se": gain_se,
    }
    if retrieved is None and bank is not None:
        retrieved = retrieved_evaluation(model, encoder, domain, tasks, sampling, bank, n_retrieve, seed)
    if retrieved is not None:
        if len(retrieved["rewards"]) != len(tasks) or retrieved["n_retrieve"] != n_retrieve:
            raise ValueError(
                f"the retrieved evaluation has {len(retrieved['rewards'])} episodes "
                f"and n_retrieve {retrieved['n_retrieve']}; "
                f"the probe {len(tasks)} and {n_retrieve}"
            )
        gain, gain_se = paired_gain(retrieved["rewards"], none)
        out.update(
            {
                **{k: retrieved[k] for k in ("n_retrieve", "bank_size", "retrieved_per_task")},
                "reward_retrieved": retrieved["heldout_reward"],
                "retrieval_gain": gain,
                "retrieval_gain_se": gain_se,
                "retrieval_same_group": retrieved["retrieval_same_group"],
                "retrieval_same_group_seen": retrieved["retrieval_same_group_seen"],
                "bank_group_coverage": retrieved.get("bank_group_coverage"),
            }
        )
    out["probe_s"] = round(time.perf_counter() - t0, 2)
    model.train(was_training)
    return out


def _seen_share(tasks: Sequence[Task], hits, bank: ExperienceBank) -> float | None:
    """The same-group share over tasks whose group has any experience in the bank (unseen test-only
    groups cannot retrieve their own; this says how much of the shortfall is theirs)."""
    groups = {e.group_id for e in bank.items}
    sel = [(t, h) for t, h in zip(tasks, hits) if t.group_id in groups]
    return same_group_share([t for t, _ in sel], [h for _, h in sel]) if sel else None


def _group_coverage(tasks: Sequence[Task], bank: ExperienceBank) -> float:
    """Share of ``tasks`` whose group (environment variant / project) has any experience in the
    bank: the ceiling of the same-group share, since a test-only variant cannot be covered."""
    groups = {e.group_id for e in bank.items}
    return sum(t.group_id in groups for t in tasks) / max(len(tasks), 1)
