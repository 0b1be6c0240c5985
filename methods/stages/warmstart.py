"""Warm start: the stand-in for pretraining (small-profile.md section 2).

Every method in the paper starts from an instruct model that already follows
instructions and already uses whatever context it is given.  A model trained
from scratch has neither, so each (domain, seed) gets one cached warm start:

1. run the scripted expert on ``n_demos`` tasks: a share ``seen_group_share``
   from the training split, the rest from the domain's ``warmstart`` split,
   whose environment variants / projects are fresh every few tasks and never
   appear in the train or test split.  The warm start thus learns the skills
   (the call format, copying names, ids and constants, reading a context
   block) on environments it cannot memorize, and meets the environments that
   the methods train on as the paper's instruct model meets EnvScaler's: new
   (measured: trained on 40k training-split demonstrations, both domains
   memorized every training group's rules, and a same-group context block
   *lowered* the likelihood of held-out expert turns, leaving nothing for
   experience or privileged context to add);
2. train a byte-level BPE tokenizer on the rendered demonstrations;
3. build the policy from its config and fine-tune it (NLL on the agent's
   tokens only) for about one epoch (``steps * batch_size ~ n_demos``: fewer,
   repeated demonstrations are memorized; 600 steps left held-out reward ~0
   because copying had not formed yet).  The policy is mediocre on the
   methods' environments because it has never seen them, which leaves every
   method room to improve;
4. a share of the demonstrations (``context_share``) carries a *context block*
   in the one neutral format of :func:`tasks.base.render_user_message`: either a
   solved trace of a *different* task of the same group (environment variant /
   project), or the task's own solution trace.  This gives the
   model the in-context ability an LLM brings from pretraining, so that every
   privileged-context teacher can use its context;
5. optionally (``onpolicy_steps`` > 0) a second stage on contexts built from
   the policy's own samples, as SDPO and Skill-SD build them
   (:mod:`methods.stages.warmstart_onpolicy`).  It is its own job, run on stage 1's
   saved output (``methods.cli warmstart-stage2``; the ``warmstart`` rule after
   ``warmstart_stage1``), so that changing it never rebuilds stage 1;
6. score the result on the held-out split (Table 1's "Vanilla") and measure
   whether a context block from a training task of the same group raises the
   likelihood of the expert's turns on held-out tasks (every method that uses
   experience or privileged context depends on it).

Batches are drawn from length-sorted pools (``bucket_batches``): with random
batches, 44-47 % of every padded batch of small-profile demonstrations was
padding (measured once; ``tests/test_warmstart.py`` checks the reduction).
"""

from __future__ import annotations

import math
import random
import sys
import time
from collections.abc import Sequence

import torch

from methods.core.batch import pad_examples
from methods.core.contexts import SKILL_MAX_CHARS, feedback_context, skill_summary
from methods.core.evaluate import evaluate, masked_nll, mean_agent_logprob
from methods.core.policy import build_policy, count_parameters
from methods.core.rollout import trajectory_ids
from methods.core.settings import ModelConfig, SamplingConfig, WarmStartConfig
from methods.core.tokenizer import ChatEncoder, train_tokenizer
from tasks.base import Episode, Task, TaskDomain, format_trace


def expert_episodes(domain: TaskDomain, tasks: Sequence[Task]) -> list[Episode]:
    """Run the scripted expert on every task, stepping all episodes together."""
    eps = [domain.reset(t) for t in tasks]
    active = [e for e in eps if not e.done]
    while active:
        domain.step_batch(active, [e.expert_action() for e in active])
        active = [e for e in active if not e.done and len(e.turns) < e.task.max_turns]
    return eps


def _context_for(
    task: Task, own: Episode, by_group: dict[str, list[Episode]], rng: random.Random, cfg: WarmStartConfig
):
    """One context block for a demonstration of ``task`` (item 4 of the module docstring).

    Kinds, as shares of the context demonstrations: the task's own solution
    (``same_task_share``), the feedback on a failed attempt at the task
    (``feedback_share``, SDPO's reprompt), a skill summary of a same-group
    episode (``skill_share``, Skill-SD's skill: what worked, or what failed and
    what was tried), else a solved trace of a same-group task.  With the two new
    shares at 0 the random stream is the one warm starts were built with before
    they existed.  Contexts that need a failed attempt come back as
    ``("feedback" | "skill", episode)`` and are resolved by :func:`build_examples`
    once the failed attempts they need have run (in one sandbox batch)."""
    r = rng.random()
    if r < cfg.same_task_share:
        return format_trace(task, own.turns, with_task=False)
    u = r - cfg.same_task_share  # P(u < x) = x for x <= 1 - same_task_share
    if cfg.feedback_share or cfg.skill_share:
        if u < cfg.feedback_share:
            return ("feedback", own)
        if u < cfg.feedback_share + cfg.skill_share:
            others = [e for e in by_group.get(task.group_id, []) if e.task.task_id != task.task_id]
            if not others:
                return None
            ex = rng.choice(others)
            if rng.random() < 0.5:  # a skill from a failure of that task, else from its success
                return ("skill", ex)
            return _success_skill(ex)
    others = [e for e in by_group.get(task.group_id, []) if e.task.task_id != task.task_id]
    if not others:
        return None
    ex = rng.choice(others)
    if cfg.retrieved_share and rng.random() < cfg.retrieved_share:
        return _retrieved_block(ex, others, by_group, rng, cfg.retrieved_docs)
    return format_trace(ex.task, ex.turns)


def _retrieved_block(
    ex: Episode, same: Sequence[Episode], by_group: dict[str, list[Episode]], rng: random.Random, n_docs: int
) -> str:
    """A context block shaped like retrieval's: ``ex`` and ``n_docs - 1`` more solved tasks, each from
    ``same`` (the group's other tasks) with probability 1/2, else from another group; shuffled."""
    groups = [g for g in by_group if g != ex.task.group_id]
    docs = [ex]
    for _ in range(n_docs - 1):
        pool = same if rng.random() < 0.5 or not groups else by_group[rng.choice(groups)]
        docs.append(rng.choice(pool))
    rng.shuffle(docs)
    return "\n\n".join(format_trace(d.task, d.turns) for d in docs)


def failed_attempts(domain, episodes: Sequence[Episode], rng: random.Random) -> dict[str, tuple[list, str]]:
    """A failed attempt at each task and the environment's feedback on it: the expert's
    turns up to a random call, that call with one character changed (:func:`_corrupt`),
    then the episode stops.  {task_id: (turns, feedback)}; tasks whose corrupted attempt
    still succeeds or gets no feedback are left out."""
    eps, actions = [], []
    for e in episodes:
        k = rng.randrange(len(e.turns)) if e.turns else 0
        bad = _corrupt(e.turns[k].action, rng) if e.turns else None
        if bad is None:
            continue
        ep = domain.reset(e.task)
        for turn in e.turns[:k]:
            ep.step(turn.action)
        if ep.done:
            continue
        eps.append(ep)
        actions.append(bad)
    if eps:
        domain.step_batch(eps, actions)
    out = {}
    for ep in eps:
        fb = ep.feedback()
        if fb and ep.reward() < 1.0:
            out[ep.task.task_id] = (list(ep.turns), fb)
    return out


def _corrupt(action: str, rng: random.Random) -> str | None:
    """``action`` with one letter or digit changed (None if it has neither)."""
    spots = [i for i, ch in enumerate(action) if ch.isalnum()]
    if not spots:
        return None
    i = rng.choice(spots)
    pool = "0123456789" if action[i].isdigit() else "abcdefghijklmnopqrstuvwxyz"
    return action[:i] + rng.choice([c for c in pool if c != action[i].lower()]) + action[i + 1 :]


def recovery_demos(
    domain, episodes: Sequence[Episode], share: float, rng: random.Random
) -> dict[int, tuple[list, frozenset[int]]]:
    """Noisy demonstrations (small-profile.md section 2) for multi-turn tasks.

    In a share of the demonstrations one expert call (never the last) has one
    character changed; the environment answers with its error, and the expert
    carries on from there.  The corrupted call stays in the sequence but out of
    the loss, so the model learns to *recover* from an error observation (which
    the expert's clean traces never show), not to make the error.  Kept only
    where the corrupted call did not advance the task and the episode still
    ends with reward 1.  Returns {episode index: (turns, masked turn indices)}.
    """
    out: dict[int, tuple[list, frozenset[int]]] = {}
    if share <= 0:
        return out
    for i, e in enumerate(episodes):
        if len(e.turns) < 2 or len(e.turns) + 1 > e.task.max_turns or rng.random() >= share:
            continue
        k = rng.randrange(len(e.turns) - 1)
        bad = _corrupt(e.turns[k].action, rng)
        if bad is None:
            continue
        ep = domain.reset(e.task)
        for turn in e.turns[:k]:
            ep.step(turn.action)
        ep.step(bad)
        if ep.done or ep.expert_action() != e.turns[k].action:
            continue  # the corrupted call ended the episode or did something
        while not ep.done and len(ep.turns) < e.task.max_turns:
            ep.step(ep.expert_action())
        if ep.reward() == 1.0:
            out[i] = (list(ep.turns), frozenset({k}))
    return out


def build_examples(domain, encoder, episodes, cfg: WarmStartConfig, rng: random.Random):
    by_group: dict[str, list[Episode]] = {}
    for e in episodes:
        by_group.setdefault(e.task.group_id, []).append(e)
    noisy = recovery_demos(domain, episodes, cfg.recovery_share, random.Random(rng.random()))
    contexts = [
        _context_for(e.task, e, by_group, rng, cfg) if rng.random() < cfg.context_share else None for e in episodes
    ]
    if cfg.demo_recovery is not None:  # the demonstrations without a context: the imperfect demonstrator's
        imp = random.Random(f"imperfect/{rng.random()}")
        for i, (e, ctx) in enumerate(zip(episodes, contexts)):
            if ctx is None and i not in noisy:
                noisy[i] = (domain.imperfect_trajectory(e.task, imp, cfg.demo_recovery).turns, frozenset())
    need = {c[1].task.task_id: c[1] for c in contexts if isinstance(c, tuple)}
    failed = failed_attempts(domain, list(need.values()), random.Random(f"failed/{rng.random()}")) if need else {}
    examples = []
    for i, (e, ctx) in enumerate(zip(episodes, contexts)):
        if isinstance(ctx, tuple):
            ctx = _resolve(ctx, failed)
        turns, masked = noisy.get(i, (e.turns, frozenset()))
        examples.append(trajectory_ids(encoder, domain, e.task, ctx, turns, masked))
    return examples


def _resolve(planned: tuple, failed: dict[str, tuple[list, str]]) -> str | None:
    """The text of a context that needed a failed attempt (None / the success's skill where none failed)."""
    kind, ep = planned
    hit = failed.get(ep.task.task_id)
    if kind == "feedback":
        return feedback_context(hit[1]) if hit else None
    return _failure_skill(hit) if hit else _success_skill(ep)


def _success_skill(ep: Episode) -> str:
    return skill_summary([t.action for t in ep.turns], True, None, SKILL_MAX_CHARS)


def _failure_skill(attempt: tuple[list, str]) -> str:
    turns, feedback = attempt
    return skill_summary([t.action for t in turns], False, feedback, SKILL_MAX_CHARS)


def copy_examples(encoder, corpus: Sequence[str], n: int, rng: random.Random) -> list[tuple[list[int], list[int]]]:
    """Synthetic copying: the user says ``repeat: <words>``, the agent repeats them.

    An instruct LLM brings from pretraining the ability to copy a name or a
    number from its prompt into its answer; a tiny model trained only on the
    tasks memorizes instead (measured: right programs with the training
    split's constants, wrong on held-out constants).  Words are drawn from the
    domain's own training texts so the tokenizer and distribution stay in-domain.
    """
    words = sorted(
        {
            w
            for text in corpus
            for w in text.replace("(", " ").replace(")", " ").replace(",", " ").split()
            if len(w) <= 12
        }
    )
    out = []
    for _ in range(n):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 6)))
        ids = encoder.prompt([("user", f"repeat: {text}")])
        ans = encoder.encode(text) + [encoder.eos_id]
        out.append((ids + ans, [0] * len(ids) + [1] * len(ans)))
    return out


def batch_stream(examples, batch_size: int, seed: int, bucket: bool = True, pool_batches: int = 16):
    """Endless batches over shuffled epochs of ``examples``.

    With ``bucket``, each pool of ``pool_batches`` batches is sorted by length
    before it is cut into batches (which are then served in random order), so a
    batch pads to nearly its own length.  Every example is served once per epoch
    either way.
    """
    rng = random.Random(f"sft/{seed}")
    order: list[int] = []
    while True:
        if len(order) < batch_size * pool_batches:
            epoch = list(range(len(examples)))
            rng.shuffle(epoch)
            order += epoch
        pool, order = order[: batch_size * pool_batches], order[batch_size * pool_batches :]
        if bucket:
            pool.sort(key=lambda i: len(examples[i][0]))
        chunks = [pool[k : k + batch_size] for k in range(0, len(pool), batch_size)]
        rng.shuffle(chunks)
        for chunk in chunks:
            yield [examples[i] for i in chunk]


def sft(model, examples, pad_id: int, cfg: WarmStartConfig, seed: int, log_every: int = 100) -> list[float]:
    """NLL on agent tokens, AdamW, linear warm-up then cosine decay to 10 %."""
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (
            min(1.0, (s + 1) / max(cfg.warmup_steps, 1))
            * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s / cfg.steps, 1.0))))
        ),
    )
    model.train()
    losses = []
    t0 = time.perf_counter()
    batches = batch_stream(examples, cfg.batch_size, seed, bucket=cfg.bucket_batches)
    dev = next(model.parameters()).device
    for step in range(cfg.steps):
        ids, attn, mask = (t.to(dev) for t in pad_examples(next(batches), pad_id))
        nll, count = masked_nll(model, ids, attn, mask)
        loss = nll / count.clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if (step + 1) % log_every == 0 or step + 1 == cfg.steps:
            eta = (time.perf_counter() - t0) / (step + 1) * (cfg.steps - step - 1)
            print(
                f"[warmstart] step {step + 1}/{cfg.steps} "
                f"nll {sum(losses[-log_every:]) / len(losses[-log_every:]):.4f} eta {eta:.0f}s",
                file=sys.stderr,
                flush=True,
            )
    return losses


def context_likelihood_check(model, encoder, domain, n: int, seed: int, pool: int = 2000) -> dict[str, float]:
    """Does a context block from a *training* task of the same group raise the
    likelihood of the expert's turns on held-out tasks?  Compared with no context,
    with a block from a training task of another group, and with the task's own
    solution trace.  A same-group block is what retrieval (retrieval RL, LOPD's
    bank) hands a policy or teacher; the own solution is what OPSD's reference,
    SDPO's successful sibling and SDFT's demonstration hand a teacher; the
    feedback and skill gains are SDPO's and Skill-SD's other contexts."""
    rng = random.Random(f"ctxcheck/{seed}")
    train_by_group: dict[str, list[Episode]] = {}
    for e in expert_episodes(domain, domain.tasks("train", pool)):
        train_by_group.setdefault(e.task.group_id, []).append(e)
    test = [t for t in domain.tasks("test", 4 * n) if t.group_id in train_by_group][:n]
    eps = expert_episodes(domain, test)
    groups = sorted(train_by_group)
    none, same, other, own = [], [], [], []
    for e in eps:
        ex = rng.choice(train_by_group[e.task.group_id])
        g2 = rng.choice([g for g in groups if g != e.task.group_id] or groups)
        ex2 = rng.choice(train_by_group[g2])
        none.append((e.task, None, e.turns))
        same.append((e.task, format_trace(ex.task, ex.turns), e.turns))
        other.append((e.task, format_trace(ex2.task, ex2.turns), e.turns))
        own.append((e.task, format_trace(e.task, e.turns, with_task=False), e.turns))
    res = {
        "logp_no_context": mean_agent_logprob(model, encoder, domain, none),
        "logp_same_group_context": mean_agent_logprob(model, encoder, domain, same),
        "logp_other_group_context": mean_agent_logprob(model, encoder, domain, other),
        "logp_own_solution_context": mean_agent_logprob(model, encoder, domain, own),
        "context_check_tasks": len(eps),
    }
    res["context_gain_same_group"] = res["logp_same_group_context"] - res["logp_no_context"]
    res["context_gain_other_group"] = res["logp_other_group_context"] - res["logp_no_context"]
    res["context_gain_own_solution"] = res["logp_own_solution_context"] - res["logp_no_context"]
    res.update(_method_context_gains(model, encoder, domain, eps, train_by_group, seed))
    return res


def _method_context_gains(
    model, encoder, domain, eps: Sequence[Episode], train_by_group: dict[str, list[Episode]], seed: int
) -> dict[str, float]:
    """The same check for the contexts SDPO and Skill-SD hand their teachers: the feedback on
    a failed attempt at the task (SDPO), and a skill of a same-group training task (Skill-SD:
    from its success or, half the time, from a failed attempt at it).  Its own random stream,
    so the three gains above do not move with it."""
    rng = random.Random(f"ctxcheck-methods/{seed}")
    failed = failed_attempts(domain, eps, random.Random(f"failed-test/{seed}"))
    pool = [e for es in train_by_group.values() for e in es]
    failed_train = failed_attempts(domain, pool, random.Random(f"failed-train/{seed}"))
    none, fb, sk = [], [], []
    for e in eps:
        ex = rng.choice(train_by_group[e.task.group_id])
        hit = failed_train.get(ex.task.task_id) if rng.random() < 0.5 else None
        sk.append((e.task, _failure_skill(hit) if hit else _success_skill(ex), e.turns))
        if e.task.task_id in failed:
            none.append((e.task, None, e.turns))
            fb.append((e.task, feedback_context(failed[e.task.task_id][1]), e.turns))
    out = {
        "context_gain_skill": mean_agent_logprob(model, encoder, domain, sk)
        - mean_agent_logprob(model, encoder, domain, [(t, None, turns) for t, _, turns in sk])
    }
    if fb:
        out["context_gain_feedback"] = mean_agent_logprob(model, encoder, domain, fb) - mean_agent_logprob(
            model, encoder, domain, none
        )
        out["context_check_feedback_tasks"] = len(fb)
    return out


def warm_start_eval(
    model,
    encoder: ChatEncoder,
    domain: TaskDomain,
    cfg: WarmStartConfig,
    sampling: SamplingConfig,
    eval_episodes: int,
    seed: int,
    context_check: bool = True,
) -> dict:
    """What a warm start reports of its policy: held-out reward (Table 1's Vanilla), the
    training split's reward, and (unless ``context_check`` is off) the context likelihood check,
    which depends on the weights and ``cfg.likelihood_tasks`` only, not on the evaluation settings."""
    heldout = evaluate(model, encoder, domain, domain.tasks("test", eval_episodes), sampling, seed=seed)
    train_eval = evaluate(model, encoder, domain, domain.tasks("train", eval_episodes), sampling, seed=seed)
    ctx = context_likelihood_check(model, encoder, domain, cfg.likelihood_tasks, seed) if context_check else {}
    return {**heldout, "train_reward": train_eval["heldout_reward"], **ctx}


def warm_start(
    domain: TaskDomain,
    model_cfg: ModelConfig,
    cfg: WarmStartConfig,
    sampling: SamplingConfig,
    eval_episodes: int,
    seed: int,
    device: str | torch.device = "cpu",
):
    """Stage 1 (items 1-4): returns (model, tokenizer, report dict); ``sampling``: the
    evaluation's; the model is built on the CPU (its initial weights do not depend on the
    device) and trained on ``device``.  The ``onpolicy_*`` fields are stage 2's
    (:func:`methods.stages.warmstart_onpolicy.continue_warm_start`), run on this stage's output."""
    t0 = time.perf_counter()
    rng = random.Random(f"warmstart/{seed}")
    n_seen = int(round(cfg.n_demos * cfg.seen_group_share))
    demo_tasks = domain.tasks("train", n_seen) if n_seen else []
    demo_tasks += domain.tasks("warmstart", cfg.n_demos - n_seen) if cfg.n_demos > n_seen else []
    episodes = expert_episodes(domain, demo_tasks)
    bad = [e.task.task_id for e in episodes if e.reward() < 1.0]
    if bad:
        raise RuntimeError(f"the scripted expert failed {len(bad)} demonstration tasks, e.g. {bad[:3]}")
    t_demo = time.perf_counter() - t0
    # The tokenizer sees the rendered demonstrations (with and without context blocks).
    corpus = [format_trace(e.task, e.turns) for e in episodes] + [
        domain.system_message(),
        "user assistant tool system context: task:",
    ]
    tokenizer = train_tokenizer(corpus, vocab_size=cfg.vocab_size)
    encoder = ChatEncoder(tokenizer)
    examples = build_examples(domain, encoder, episodes, cfg, rng)
    if cfg.copy_share > 0:
        n_copy = (
            int(round(len(examples) * cfg.copy_share / (1 - cfg.copy_share))) if cfg.copy_share < 1 else len(examples)
        )
        examples += copy_examples(encoder, corpus, n_copy, rng)
    model = build_policy(model_cfg, tokenizer, seed).to(device)  # type: ignore[arg-type]  # transformers' .to() typing
    print(
        f"[warmstart] {domain.name} seed {seed}: {len(examples)} demos, "
        f"{count_parameters(model) / 1e6:.2f} M parameters, vocab {len(tokenizer)}",
        file=sys.stderr,
        flush=True,
    )
    losses = sft(model, examples, encoder.pad_id, cfg, seed)
    t_sft = time.perf_counter() - t0 - t_demo
    report = {
        **warm_start_eval(model, encoder, domain, cfg, sampling, eval_episodes, seed),
        "demos_seen_groups": n_seen,
        "demos_warmstart_groups": len(demo_tasks) - n_seen,
        "final_nll": sum(losses[-50:]) / len(losses[-50:]),
        "parameters": count_parameters(model),
        "vocab_size": len(tokenizer),
        "demo_s": round(t_demo, 2),
        "sft_s": round(t_sft, 2),
        "wall_s": round(time.perf_counter() - t0, 2),
    }
    return model, tokenizer, report
