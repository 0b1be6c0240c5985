"""Privileged-context texts shared by the methods that build them and by the warm start
that teaches the policy to read them (one format each, so the warm start's demonstrations
and a method's teacher prompt cannot drift apart)."""

from __future__ import annotations

from collections.abc import Sequence

from tasks.base import format_trace

SKILL_MAX_CHARS = 600  # Skill-SD's default skill length (SkillSDConfig.max_skill_chars)


def feedback_context(feedback: str) -> str:
    """SDPO's reprompt for a failed attempt: the environment's feedback on it."""
    return f"feedback on a failed attempt:\n{feedback.strip()}"


def skill_summary(actions: Sequence[str], success: bool, feedback: str | None, max_chars: int) -> str:
    """Skill-SD's deterministic skill of one completed trajectory: what worked (a success's
    action sequence), or what failed (its feedback) and what was tried."""
    acts = [a.strip() for a in actions]
    if success:
        text = "what worked:\n" + "\n".join(f"> {a}" for a in acts)
    else:
        text = f"what failed: {(feedback or 'no feedback').strip()}\ntried:\n" + "\n".join(f"> {a}" for a in acts)
    return text[:max_chars]


def sdpo_context(sibling_trace: str | None, feedback: str | None) -> str | None:
    """SDPO's reprompt: a successful attempt's trace and/or the feedback on this attempt."""
    parts = []
    if sibling_trace:
        parts.append(sibling_trace)
    if feedback:
        parts.append(feedback_context(feedback))
    return "\n\n".join(parts) or None


def sdpo_choice(
    rewards: Sequence[float],
    i: int,
    group: Sequence[int],
    threshold: float = 1.0,
    use_sibling: bool = True,
    use_feedback: bool = True,
) -> tuple[int | None, bool]:
    """Which parts SDPO's teacher context for rollout ``i`` takes, from the rewards alone: the index
    of the first successful rollout among ``group`` (the same task's rollouts, in batch order;
    never ``i`` itself; None: none), and whether ``i``'s own feedback enters (it failed).  The
    suite's loop (:func:`sdpo_parts`) and verl's trainer (``methods/verl_backend/sdpo.py``) both
    choose here."""
    sibling = next((j for j in group if j != i and rewards[j] >= threshold), None) if use_sibling else None
    return sibling, use_feedback and rewards[i] < threshold


def sdpo_parts(
    rollouts: Sequence,
    i: int,
    group: Sequence[int],
    threshold: float = 1.0,
    use_sibling: bool = True,
    use_feedback: bool = True,
) -> tuple[str | None, str | None]:
    """The two parts of SDPO's teacher context for ``rollouts[i]`` (:func:`sdpo_choice`): the trace
    of the first successful rollout among ``group``, and, if ``rollouts[i]`` failed, the
    environment's feedback on it (None: absent)."""
    j, with_feedback = sdpo_choice([r.reward for r in rollouts], i, group, threshold, use_sibling, use_feedback)
    sibling = format_trace(rollouts[j].task, rollouts[j].episode.turns, with_task=False) if j is not None else None
    return sibling, rollouts[i].feedback if with_feedback else None


def sdpo_reprompt(
    rollouts: Sequence,
    i: int,
    group: Sequence[int],
    threshold: float = 1.0,
    use_sibling: bool = True,
    use_feedback: bool = True,
) -> str | None:
    """SDPO's teacher context for ``rollouts[i]`` (:func:`sdpo_parts` joined by :func:`sdpo_context`).
    None: no signal."""
    return sdpo_context(*sdpo_parts(rollouts, i, group, threshold, use_sibling, use_feedback))


def sdpo_kind(sibling: str | None, feedback: str | None) -> str | None:
    """What an SDPO context is made of: ``sibling`` (a successful sibling's trace, with the
    feedback when the rollout failed), ``feedback_only``, or None (no context)."""
    return "sibling" if sibling else "feedback_only" if feedback else None


def rollout_skill(rollout, max_chars: int) -> str:
    """Skill-SD's skill of one completed rollout (:func:`skill_summary` of its actions)."""
    return skill_summary([t.action for t in rollout.episode.turns], rollout.reward >= 1.0, rollout.feedback, max_chars)
