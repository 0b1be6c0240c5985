"""SDPO's teacher contexts on verl, built from a step's batch as the suite's SDPO builds them.

The suite's SDPO (:mod:`methods.sdpo`) gives each rollout a privileged context from its own group:
the trace of a *successful sibling* (another rollout of the same task in the same step), and, where
the rollout failed, the environment's feedback on it; a rollout with neither gets no signal.  On
verl a step's rollouts of one prompt share its ``uid`` (TransferQueue's keys are
``{uid}_{session_id}_{index}``, as verl's replay buffer reads them), and what a context needs of an
episode travels in its ``extra_fields`` under :data:`SDPO_EPISODE`, put there by the agent loop
(:class:`methods.verl_backend.agent_loop.EpisodeAgentLoop`): the row that names its task, its trace
(:func:`tasks.base.format_trace`, without the task), its reward and its feedback.

:func:`sdpo_contexts` chooses with the suite's own :func:`methods.core.contexts.sdpo_choice` and
joins with :func:`~methods.core.contexts.sdpo_context`, so the texts are the suite's;
:class:`methods.verl_backend.trainer.SDPOTrainer` renders them into teacher prompts and scores them
on the EMA teacher.  verl's padding rows (``is_padding``: copies that fill the data-parallel ranks,
under their own ``uid``) are neither siblings nor taught.
"""

from __future__ import annotations

from collections.abc import Sequence

from methods.core.contexts import sdpo_choice, sdpo_context, sdpo_kind

__all__ = ["SDPO_EPISODE", "episode_record", "groups_of", "sdpo_contexts"]

#: the ``extra_fields`` key of what SDPO's trainer reads of a training episode
SDPO_EPISODE = "lopd_bench_sdpo_episode"


def episode_record(row: dict, trace: str, reward: float, feedback: str | None) -> dict:
    """What the agent loop puts under :data:`SDPO_EPISODE` for a finished training episode."""
    return {"row": row, "trace": trace, "reward": float(reward), "feedback": feedback}


def groups_of(keys: Sequence[str], padding: Sequence[bool]) -> dict[int, list[int]]:
    """For each real row, the indices of the real rows of its prompt's group (its ``uid``, the key's
    part before the first ``_``), in batch order; padding rows are in no group."""
    members: dict[str, list[int]] = {}
    for i, (key, pad) in enumerate(zip(keys, padding, strict=True)):
        if not pad:
            members.setdefault(key.split("_")[0], []).append(i)
    return {i: group for group in members.values() for i in group}


def sdpo_contexts(
    episodes: Sequence[dict | None],
    keys: Sequence[str],
    padding: Sequence[bool],
    success_threshold: float = 1.0,
    use_sibling: bool = True,
    use_feedback: bool = True,
) -> tuple[list[str | None], list[str | None]]:
    """Each row's SDPO context (None: no signal) and its kind (``sibling``, ``feedback_only``, None),
    from the rows' :data:`SDPO_EPISODE` records (None: not a training episode, e.g. a padding row)."""
    groups = groups_of(keys, padding)
    rewards = [e["reward"] if e is not None else float("-inf") for e in episodes]
    contexts: list[str | None] = []
    kinds: list[str | None] = []
    for i, episode in enumerate(episodes):
        if i not in groups or episode is None:
            contexts.append(None)
            kinds.append(None)
            continue
        j, with_feedback = sdpo_choice(rewards, i, groups[i], success_threshold, use_sibling, use_feedback)
        sibling = episodes[j]["trace"] if j is not None else None  # type: ignore[index]
        feedback = episode["feedback"] if with_feedback else None
        contexts.append(sdpo_context(sibling, feedback))
        kinds.append(sdpo_kind(sibling, feedback))
    return contexts, kinds
