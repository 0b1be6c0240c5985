"""Batched multi-turn rollouts with a KV cache.

``sample`` decodes a batch of left-padded prompts token by token with a
``DynamicCache`` (one forward over the prompt, then one token per step), and
stops a row at ``<|im_end|>``.  ``run_episodes`` drives many episodes at once:
every turn, the still-running episodes are decoded together, their actions are
stepped through the domain (in parallel where the domain supports it), and the
observations are appended as ``tool`` messages before the next turn.

Each finished episode becomes a :class:`Rollout`: the full token sequence, a
mask of the tokens the agent generated (the only tokens any loss touches), the
reward, the environment feedback and the turn trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
from transformers import DynamicCache

from tasks.base import Episode, Task, TaskDomain, render_user_message

from .tokenizer import ChatEncoder


@dataclass
class Rollout:
    task: Task
    context: str | None  # context block the *student* saw (None for most methods)
    ids: list[int]
    agent_mask: list[int]  # 1 on tokens the agent generated
    agent_logprobs: list[float]  # sampling-time log-prob of each agent token, in order
    reward: float
    feedback: str
    episode: Episode = field(repr=False)
    truncated: bool = False

    @property
    def generated_tokens(self) -> int:
        return sum(self.agent_mask)

    @property
    def prompt_len(self) -> int:
        return self.agent_mask.index(1) if 1 in self.agent_mask else len(self.ids)


@dataclass
class SamplingConfig:
    temperature: float = 1.0  # 0 -> greedy
    max_new_tokens: int = 48  # per assistant turn
    max_seq_len: int = 1024  # a conversation longer than this ends the episode

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"sampling.temperature must be >= 0, got {self.temperature}")
        if self.max_new_tokens < 1 or self.max_seq_len < 2:
            raise ValueError("sampling.max_new_tokens must be >= 1 and max_seq_len >= 2")


def _left_pad(seqs: Sequence[Sequence[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
        mask[i, width - len(s) :] = 1
    return ids.to(device), mask.to(device)


@torch.no_grad()
def sample(
    model,
    prompts: Sequence[Sequence[int]],
    eos_id: int,
    pad_id: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    return_logprobs: bool = False,
):
    """Sample one continuation per prompt; each ends with ``eos_id`` unless cut at ``max_new_tokens``.

    With ``return_logprobs`` also returns, per continuation, the log-probability
    of each sampled token under the sampling distribution softmax(logits / T):
    PPO's "old" log-probs, which then need no second forward pass.  As in verl,
    the policy being optimised is the tempered one (see ``token_logprobs``).

    Shapes: prompts are ragged lists; internally [B, T] left-padded with an
    attention mask and explicit position ids so that padding never shifts RoPE.
    """
    device = next(model.parameters()).device
    ids, attn = _left_pad(prompts, pad_id, device)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    out = model(input_ids=ids, attention_mask=attn, position_ids=pos, past_key_values=cache, use_cache=True)
    logits = out.logits[:, -1, :]
    next_pos = pos[:, -1:] + 1
    B = len(prompts)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    steps: list[torch.Tensor] = []
    step_logp: list[torch.Tensor] = []
    for _ in range(max_new_tokens):
        if temperature == 0:
            tok = logits.argmax(-1)
        else:
            probs = torch.softmax(logits.float() / temperature, dim=-1)
            tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        if return_logprobs:
            scaled = logits.float() / (temperature if temperature > 0 else 1.0)
            step_logp.append(torch.log_softmax(scaled, dim=-1).gather(-1, tok[:, None]).squeeze(-1))
        tok = torch.where(done, torch.full_like(tok, pad_id), tok)
        steps.append(tok)
        done |= tok == eos_id
        if bool(done.all()):
            break
        attn = torch.cat([attn, torch.ones((B, 1), dtype=attn.dtype, device=device)], dim=1)
        out = model(input_ids=tok[:, None], attention_mask=attn, position_ids=next_pos, past_key_values=cache, use_cache=True)
        logits = out.logits[:, -1, :]
        next_pos = next_pos + 1
    gen = torch.stack(steps, dim=1).tolist()
    lps = torch.stack(step_logp, dim=1).tolist() if return_logprobs else None
    result, result_lp = [], []
    for i, row in enumerate(gen):
        # rows are pad-filled only after their eos, so the kept prefix is contiguous
        n = row.index(eos_id) + 1 if eos_id in row else len(row)
        result.append(row[:n])
        if lps is not None:
            result_lp.append(lps[i][:n])
    return (result, result_lp) if return_logprobs else result


def run_episodes(
    model,
    encoder: ChatEncoder,
    domain: TaskDomain,
    tasks: Sequence[Task],
    contexts: Sequence[str | None] | None,
    cfg: SamplingConfig,
    generator: torch.Generator | None = None,
    batch_size: int = 256,
) -> list[Rollout]:
    """Play one episode per task, all batched turn by turn.  Returns rollouts in task order."""
    contexts = list(contexts) if contexts is not None else [None] * len(tasks)
    out: list[Rollout] = []
    for start in range(0, len(tasks), batch_size):
        out += _run_chunk(model, encoder, domain, tasks[start : start + batch_size], contexts[start : start + batch_size], cfg, generator)
    return out


def _initial_ids(encoder: ChatEncoder, domain: TaskDomain, task: Task, context: str | None) -> list[int]:
    messages = []
    if domain.system_message():
        messages.append(("system", domain.system_message()))
    messages.append(("user", render_user_message(task, context)))
    return encoder.prompt(messages)


def _run_chunk(model, encoder, domain, tasks, contexts, cfg, generator) -> list[Rollout]:
    episodes = [domain.reset(t) for t in tasks]
    ids = [_initial_ids(encoder, domain, t, c) for t, c in zip(tasks, contexts)]
    masks = [[0] * len(x) for x in ids]
    logps: list[list[float]] = [[] for _ in ids]
    truncated = [False] * len(tasks)
    active = [i for i, ep in enumerate(episodes) if not ep.done]
    while active:
        room = [cfg.max_seq_len - len(ids[i]) for i in active]
        gens, gen_lp = sample(
            model,
            [ids[i] for i in active],
            encoder.eos_id,
            encoder.pad_id,
            max_new_tokens=max(1, min(cfg.max_new_tokens, max(room))),
            temperature=cfg.temperature,
            generator=generator,
            return_logprobs=True,
        )
        actions = []
        for i, g, lp, r in zip(active, gens, gen_lp, room):
            g = g[: max(r, 0)]
            logps[i] += lp[: len(g)]
            ids[i] += g
            masks[i] += [1] * len(g)
            actions.append(encoder.decode(g))
        results = domain.step_batch([episodes[i] for i in active], actions)
        still = []
        for i, res in zip(active, results):
            ep = episodes[i]
            over = len(ids[i]) >= cfg.max_seq_len or len(ep.turns) >= tasks[i].max_turns
            if res.done or ep.done:
                continue
            if over:
                truncated[i] = True
                continue
            # a turn cut at max_new_tokens is closed as the chat format requires (not an agent token)
            close = [] if ids[i][-1] == encoder.eos_id else [encoder.eos_id]
            nxt = close + encoder.after_assistant() + encoder.message("tool", res.observation or "") + encoder.header("assistant")
            if len(ids[i]) + len(nxt) >= cfg.max_seq_len:
                truncated[i] = True
                continue
            ids[i] += nxt
            masks[i] += [0] * len(nxt)
            still.append(i)
        active = still
    return [
        Rollout(task=t, context=c, ids=ids[i], agent_mask=masks[i], agent_logprobs=logps[i], reward=float(ep.reward()), feedback=ep.feedback(), episode=ep, truncated=truncated[i])
        for i, (t, c, ep) in enumerate(zip(tasks, contexts, episodes))
    ]


def initial_prompt_ids(encoder: ChatEncoder, domain: TaskDomain, task: Task, context: str | None) -> list[int]:
    """Ids of the episode's opening messages plus the assistant header (what rollouts start from)."""
    return _initial_ids(encoder, domain, task, context)


def trajectory_ids(encoder: ChatEncoder, domain: TaskDomain, task: Task, context: str | None, turns) -> tuple[list[int], list[int]]:
    """Canonical ids and agent mask of a finished trajectory (e.g. an expert demonstration),
    laid out exactly as :func:`run_episodes` lays out a sampled one."""
    ids = _initial_ids(encoder, domain, task, context)
    mask = [0] * len(ids)
    for k, turn in enumerate(turns):
        act = encoder.encode(turn.action) + [encoder.eos_id]
        ids += act
        mask += [1] * len(act)
        if k + 1 < len(turns):
            nxt = encoder.after_assistant() + encoder.message("tool", turn.observation or "") + encoder.header("assistant")
            ids += nxt
            mask += [0] * len(nxt)
    return ids, mask
