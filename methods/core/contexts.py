"""Privileged-context texts shared by the methods that build them and by the warm start
that teaches the policy to read them (one format each, so the warm start's demonstrations
and a method's teacher prompt cannot drift apart)."""

from __future__ import annotations

from typing import Sequence

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
