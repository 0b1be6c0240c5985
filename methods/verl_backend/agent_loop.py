"""The suite's episodes as a verl agent loop (``agent_name: lopd_bench_episode``, the exported rows').

verl's ``AgentLoopWorker`` instantiates the loop registered under a row's ``agent_name`` and calls
``run`` with the row's fields.  :class:`EpisodeAgentLoop` rebuilds the suite task the row names
(:func:`methods.verl_backend.export.task_of_row`), then plays the suite's own ``Episode`` against
verl's generation server, turn by turn, in exactly the token layout of the suite's rollout engine
(:func:`methods.core.rollout.run_episodes`): the prompt of
:func:`~methods.core.rollout.initial_prompt_ids`, each action the model's tokens through
``<|im_end|>``, and between turns :func:`~methods.core.rollout.turn_break_ids` (the environment's
observation as a ``tool`` message), which are not the agent's tokens (``response_mask`` 0).  The
episode's reward is the trajectory's ``reward_score``; its feedback and turn count travel in
``extra_fields``.

For retrieval RL (a ``main_ppo`` config with a ``lopd_bench.retrieval`` section), each episode's
prompt carries the experience retrieved for its task from the run's bank actor
(:mod:`methods.verl_backend.bank`), and a finished training episode is staged there; the trainer
adds the staged ones to the bank after the step.

For OPSD (``lopd_bench.teacher_context: expert``), each training episode also carries the prompt
its teacher reads, the task's reference solution ahead of the task, under :data:`TEACHER_PROMPT`
(:mod:`methods.verl_backend.distill` scores the response after it).  For Skill-SD
(``teacher_context: skill``, with a ``lopd_bench.skills`` section), that prompt carries the skill
the run's skill library (:mod:`methods.verl_backend.skills`) chose for the task, and the finished
training episode's outcome is staged there; a task with no skill yet has no teacher prompt.  For
SDPO (``teacher_context: sdpo``) no episode knows its context alone (it is a successful sibling's
trace or the episode's own feedback): each training episode carries its row, trace, reward and
feedback under :data:`~methods.verl_backend.sdpo.SDPO_EPISODE`, and the trainer builds the contexts
from the step's groups.

An episode ends when the environment says so, after the task's ``max_turns`` assistant turns, or
when the response would outgrow ``rollout.response_length`` (then it is cut, as the suite's engine
cuts at ``max_seq_len``, and scored as it stands).
"""

from __future__ import annotations

import time
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from methods.core.rollout import initial_prompt_ids, turn_break_ids
from methods.core.tokenizer import ChatEncoder
from tasks.base import Task, TaskDomain, format_trace

from .bank import SECTION, bank_client, retrieval_settings
from .export import AGENT_NAME, task_of_row
from .sdpo import SDPO_EPISODE, episode_record
from .skills import skill_settings, skills_client

__all__ = ["EpisodeAgentLoop", "play_episode"]


async def play_episode(
    generate,
    encoder: ChatEncoder,
    domain: TaskDomain,
    task: Task,
    sampling_params: dict[str, Any],
    response_length: int,
    request_id: str | None = None,
    context: str | None = None,
    on_finish=None,
) -> AgentLoopOutput:
    """Play one episode of ``task`` with ``generate`` (verl's ``server_manager.generate``: prompt ids
    in, a ``TokenOutput`` with ``token_ids`` and optionally ``log_probs`` out).  ``context`` is the
    student's context block (retrieval RL's retrieved experience), placed as the suite's rollout
    engine places it; ``on_finish``, if given, is awaited with the finished episode."""
    prompt_ids = initial_prompt_ids(encoder, domain, task, context)
    episode = domain.reset(task)
    response: list[int] = []
    mask: list[int] = []
    logprobs: list[float] | None = []  # None once a turn comes without them
    timing = {"generate_sequences": 0.0, "tool_calls": 0.0}
    truncated = False
    request_id = request_id or uuid4().hex
    while not episode.done:
        room = response_length - len(response)
        if room <= 0:
            truncated = True
            break
        params = dict(sampling_params, max_tokens=min(sampling_params.get("max_tokens", room), room))
        t0 = time.perf_counter()
        out = await generate(request_id=request_id, prompt_ids=prompt_ids + response, sampling_params=params)
        timing["generate_sequences"] += time.perf_counter() - t0
        action = list(out.token_ids)[:room]
        response += action
        mask += [1] * len(action)
        if logprobs is not None and out.log_probs is not None:
            logprobs += list(out.log_probs)[: len(action)]
        else:
            logprobs = None
        t0 = time.perf_counter()
        result = domain.step_batch([episode], [encoder.decode(action)])[0]
        timing["tool_calls"] += time.perf_counter() - t0
        if result.done or episode.done:
            break
        closing = turn_break_ids(encoder, result.observation, close=not action or action[-1] != encoder.eos_id)
        if len(episode.turns) >= task.max_turns or len(response) + len(closing) >= response_length:
            truncated = True
            break
        response += closing
        mask += [0] * len(closing)
        if logprobs is not None:
            logprobs += [0.0] * len(closing)
    if on_finish is not None:
        await on_finish(episode)
    return AgentLoopOutput(
        prompt_ids=prompt_ids,
        response_ids=response,
        response_mask=mask,
        response_logprobs=logprobs,
        reward_score=float(episode.reward()),
        num_turns=1 + 2 * len(episode.turns),  # the user's, then each assistant turn and its observation
        metrics=AgentLoopMetrics(**timing),
        extra_fields={
            "feedback": episode.feedback(),
            "turns": len(episode.turns),
            "truncated": truncated,
            "task_id": task.task_id,
            "context_chars": len(context or ""),
        },
    )


#: built domains and their task indexes, and the reference solutions already played, shared by the
#: episodes of this process (verl builds an agent loop per episode)
_DOMAINS: dict = {}
_EXPERT: dict = {}


def _expert_trace(domain: TaskDomain, task: Task) -> str:
    """The task's reference solution as the teacher's context, played once per task and process
    (for code it runs the reference program in the sandbox), as the suite's loop caches it."""
    from methods.core.distill import expert_trace

    key = (domain.name, domain.seed, task.split, task.task_id)
    if key not in _EXPERT:
        _EXPERT[key] = expert_trace(domain, task)
    return _EXPERT[key]


#: the ``extra_fields`` key of an episode's teacher prompt ids (methods/verl_backend/distill.py reads it)
TEACHER_PROMPT = "lopd_bench_teacher_prompt_ids"


def teacher_context(config) -> str | None:
    """The privileged context the teacher reads (``lopd_bench.teacher_context``: ``expert``, the
    task's reference solution; ``skill``, the skill chosen for the task; ``sdpo``, a successful
    sibling's trace or the feedback, built by the trainer from the step's groups; None: no
    privileged teacher)."""
    section = config.get(SECTION) if config is not None else None
    return section.get("teacher_context") if section is not None else None


@register(AGENT_NAME)
class EpisodeAgentLoop(AgentLoopBase):
    """Plays a row of the exported parquet files as the suite's episode (module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.response_length = self.rollout_config.response_length
        self.encoder = ChatEncoder(self.tokenizer)

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        row = kwargs["extra_info"]
        domain, task = task_of_row(row, _DOMAINS)
        context, skill, finishers = None, None, []
        retrieval = retrieval_settings(self.config)
        if retrieval is not None:  # retrieval RL: experience in the student's prompt; training episodes grow the bank
            bank = bank_client(retrieval)
            context = await bank.context(row)
            if task.split == "train":
                finishers.append(lambda episode: bank.stage(row, episode.turns, float(episode.reward())))
        skills = skill_settings(self.config)
        if skills is not None and task.split == "train":  # Skill-SD: the teacher reads the task's skill
            library = skills_client(skills)
            skill = await library.choose(row)
            finishers.append(lambda episode: library.stage(row, episode))
        privileged = teacher_context(self.config)
        trace: list[str] = []
        if privileged == "sdpo" and task.split == "train":  # SDPO: the trainer builds contexts from the groups

            async def keep_trace(episode):
                trace.append(format_trace(task, episode.turns, with_task=False))

            finishers.append(keep_trace)

        async def on_finish(episode):
            for finish in finishers:
                await finish(episode)

        out = await play_episode(
            self.server_manager.generate,
            self.encoder,
            domain,
            task,
            sampling_params,
            self.response_length,
            context=context,
            on_finish=on_finish if finishers else None,
        )
        if privileged in ("expert", "skill") and task.split == "train":
            # the teacher reads the response after the privileged context (methods/verl_backend/distill.py):
            # OPSD the task's reference solution, Skill-SD the chosen skill (none yet: no teacher signal)
            text = _expert_trace(domain, task) if privileged == "expert" else skill
            if text is not None:
                out.extra_fields[TEACHER_PROMPT] = initial_prompt_ids(self.encoder, domain, task, text)
        if trace:  # SDPO: what its trainer reads to build the group's contexts (methods/verl_backend/sdpo.py)
            feedback = out.extra_fields["feedback"]
            out.extra_fields[SDPO_EPISODE] = episode_record(row, trace[0], out.reward_score, feedback)
        return out
