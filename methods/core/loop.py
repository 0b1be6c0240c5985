"""The one shared training loop.

Every method runs through :func:`train`.  The loop owns seeding, sampling
rollouts, the budget ledger, the optimizer step (PPO-style epochs over
minibatches, gradient clipping), held-out evaluation at fixed rollout counts,
checkpoint/resume and ``metrics.jsonl``; a method (``methods/<name>.py``)
supplies only its group size, the student's context, its per-batch
precomputation, its loss and its post-step hook.  Budgets therefore match by
construction: the loop stops every method at the same number of student
rollouts, and rounds a step down rather than overshoot.

Resume: a checkpoint holds the weights, optimizer, method state, ledger, task
sampler position and every RNG state, so a killed run rerun with the same
arguments continues where it stopped and ends with the same metrics as an
uninterrupted one.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from tasks.base import Task, TaskDomain

from .batch import RolloutBatch, agent_token_logprobs, collate, rows_of
from .evaluate import contexts_fingerprint, evaluate, summarize
from .ledger import Ledger
from .registry import Method
from .rollout import run_episodes
from .settings import TrainConfig
from .tokenizer import ChatEncoder


@dataclass
class RunContext:
    """What a method may use: the student, its tokenizer, the domain, the ledger."""

    model: Any
    tokenizer: Any
    encoder: ChatEncoder
    domain: TaskDomain
    train_cfg: TrainConfig
    ledger: Ledger
    seed: int
    device: torch.device
    warmstart_path: Path | None = None
    out_dir: Path | None = None
    #: the experience bank's settings (methods with ``uses_bank``; the job's ``bank`` section)
    bank_config: dict[str, Any] | None = None
    #: the bank seeded before RL (``bank.pt``), when the profile seeds one
    bank_path: Path | str | None = None
    #: the file the method's cold start wrote (methods with ``needs_cold_start``)
    cold_start_path: Path | str | None = None
    #: the base policy's own ``eval.json`` when its evaluation is this run's (see :func:`_base_eval`)
    base_eval: dict[str, Any] | None = None
    #: evaluations of the base policy with contexts in the student's prompt, each with its
    #: ``contexts_sha256`` (e.g. retrieval's, ``methods.cli retrieved-eval``; see :func:`_base_eval`)
    context_evals: list[dict[str, Any]] = field(default_factory=list)
    #: where held-out evaluation happens when it is not ``domain``'s own test split: an
    #: evaluation-only benchmark (the job's ``heldout_domain``, e.g. HumanEval for code)
    heldout_domain: TaskDomain | None = None


class TaskSampler:
    """Deterministic epochs over the training split, reshuffled per epoch from the seed."""

    def __init__(self, tasks: list[Task], seed: int):
        if not tasks:
            raise ValueError("the training split is empty")
        self.tasks, self.seed, self.epoch, self.pos = tasks, seed, 0, 0
        self._order = self._shuffle()

    def _shuffle(self) -> list[int]:
        order = list(range(len(self.tasks)))
        random.Random(f"{self.seed}/{self.epoch}").shuffle(order)
        return order

    def next(self, n: int) -> list[Task]:
        out = []
        for _ in range(n):
            if self.pos >= len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._shuffle()
            out.append(self.tasks[self._order[self.pos]])
            self.pos += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, s: dict[str, int]) -> None:
        self.epoch, self.pos = s["epoch"], s["pos"]
        self._order = self._shuffle()


def _eval_points(cfg: TrainConfig) -> list[int]:
    pts = list(range(0, cfg.rollout_budget, cfg.eval_every)) + [cfg.rollout_budget]
    return sorted(set(pts))


def _atomic_write_bytes(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class MetricsLog:
    """Append-only ``metrics.jsonl``; on resume, lines past the checkpoint are dropped."""

    def __init__(self, path: Path):
        self.path = path

    def truncate_to_step(self, step: int) -> None:
        if not self.path.exists():
            return
        keep = [
            ln for ln in self.path.read_text().splitlines() if (rec := _parse(ln)) is not None and rec["step"] <= step
        ]
        _atomic_write_bytes(self.path, lambda f: f.write("".join(k + "\n" for k in keep).encode()))

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")

    def records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [r for ln in self.path.read_text().splitlines() if (r := _parse(ln)) is not None]


def _parse(line: str) -> dict[str, Any] | None:
    """A metrics line, or None for a blank or torn one (a kill mid-write)."""
    try:
        return json.loads(line) if line.strip() else None
    except json.JSONDecodeError:
        return None


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def train(method: Method, run: RunContext, out_dir: Path, label: str = "", fingerprint: str = "") -> dict[str, Any]:
    """Train ``method`` until the rollout budget is spent.  Returns the final evaluation.

    ``fingerprint`` identifies what the run is (job settings, warm start, code);
    a checkpoint written under another fingerprint is discarded, not resumed.
    """
    training = _Training(method, run, out_dir, label, fingerprint)
    training.resume_or_start()
    training.evaluate_if_due()
    while training.budget_left():
        training.step()
        training.evaluate_if_due()
        training.checkpoint_if_due()
    return training.final_evaluation()


class _Training:
    """The state of one run and the named steps :func:`train` takes over it."""

    def __init__(self, method: Method, run: RunContext, out_dir: Path, label: str, fingerprint: str):
        cfg = run.train_cfg
        self.method, self.run, self.cfg, self.label, self.fingerprint = method, run, cfg, label, fingerprint
        self.model, self.ledger, self.domain = run.model, run.ledger, run.domain
        self.eval_domain = run.heldout_domain or run.domain
        out_dir.mkdir(parents=True, exist_ok=True)
        self.metrics = MetricsLog(out_dir / "metrics.jsonl")
        self.ckpt_path = out_dir / "checkpoint.pt"
        self.G = G = method.cfg.group_size
        for name in ("rollout_budget", "rollouts_per_step"):
            if getattr(cfg, name) % G:
                raise ValueError(
                    f"train.{name} ({getattr(cfg, name)}) must be a multiple of {method.name}.group_size ({G})"
                )
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.sampler = TaskSampler(self.domain.tasks("train"), run.seed)
        self.test_tasks = self.eval_domain.tasks("test", cfg.eval_episodes)
        self.gen = torch.Generator(device=run.device).manual_seed(run.seed)
        torch.manual_seed(run.seed)
        self.evals_done: list[int] = []
        self.t_start: float | None = None  # when this process took its first step (for the ETA)
        self.r_start = 0

    # --- resume and checkpoints ------------------------------------------------------
    def resume_or_start(self) -> None:
        """Resume from this job's checkpoint if there is one; discard another job's; then start the clock."""
        ckpt_path, metrics, label = self.ckpt_path, self.metrics, self.label
        if ckpt_path.exists():
            state = torch.load(ckpt_path, map_location="cpu", weights_only=False)
            if state.get("fingerprint", "") != self.fingerprint:
                _log(
                    f"[{label}] {ckpt_path} belongs to another job (settings, warm start or code changed): "
                    "starting afresh"
                )
                ckpt_path.unlink()
                metrics.path.unlink(missing_ok=True)
        if ckpt_path.exists():
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.method.load_state_dict(state["method"])
            self.ledger.load_state_dict(state["ledger"])
            self.sampler.load_state_dict(state["sampler"])
            self.gen.set_state(state["generator"])
            torch.set_rng_state(state["torch_rng"])
            self.evals_done = state["evals_done"]
            metrics.truncate_to_step(self.ledger.steps)
            _log(
                f"[{label}] resumed from {ckpt_path} at step {self.ledger.steps}, "
                f"{self.ledger.rollouts}/{self.ledger.rollout_budget} rollouts"
            )
        elif metrics.path.exists():
            metrics.path.unlink()  # a previous attempt died before its first checkpoint
        self.model.train()
        self.ledger.start_clock()

    def checkpoint(self) -> None:
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "method": self.method.state_dict(),
            "ledger": self.ledger.state_dict(),
            "sampler": self.sampler.state_dict(),
            "generator": self.gen.get_state(),
            "torch_rng": torch.get_rng_state(),
            "evals_done": self.evals_done,
            "fingerprint": self.fingerprint,
        }
        _atomic_write_bytes(self.ckpt_path, lambda f: torch.save(state, f))

    def checkpoint_if_due(self) -> None:
        if self.ledger.steps % self.cfg.checkpoint_every == 0 or self.ledger.remaining < self.G:
            self.ledger.tick()
            self.checkpoint()

    # --- evaluation ------------------------------------------------------------------
    def evaluate_if_due(self, force: bool = False) -> dict[str, Any] | None:
        """Evaluate on the held-out tasks at each due rollout count (or now, with ``force``)."""
        cfg, ledger, run = self.cfg, self.ledger, self.run
        due = [p for p in _eval_points(cfg) if p <= ledger.rollouts and p not in self.evals_done]
        if not due and not force:
            return None
        t0 = time.perf_counter()
        inner = 0 < ledger.rollouts < cfg.rollout_budget and cfg.curve_eval_episodes is not None
        tasks = self.test_tasks[: cfg.curve_eval_episodes] if inner else self.test_tasks
        res = _base_eval(run, self.method, tasks, cfg) if ledger.rollouts == 0 else None
        if res is None:
            res = evaluate(
                self.model,
                run.encoder,
                self.eval_domain,
                tasks,
                cfg.sampling(eval=True),
                contexts_fn=self.method.student_contexts,
                seed=run.seed,
            )
        self.evals_done.extend(due)
        ledger.add_eval_time(time.perf_counter() - t0)
        rec = {
            "kind": "eval",
            "step": ledger.steps,
            **ledger.snapshot(),
            **res,
            "eval_s": round(time.perf_counter() - t0, 4),
        }
        self.metrics.write(rec)
        _log(
            f"[{self.label}] eval at {ledger.rollouts}/{ledger.rollout_budget} rollouts: "
            f"heldout_reward {res['heldout_reward']:.3f}"
        )
        return rec

    def final_evaluation(self) -> dict[str, Any]:
        """The evaluation at the spent budget (made now if the last one was earlier)."""
        final = [r for r in self.metrics.records() if r["kind"] == "eval"]
        if not final or final[-1]["rollouts"] != self.ledger.rollouts:
            final.append(cast(dict[str, Any], self.evaluate_if_due(force=True)))  # forced: always a record
            self.checkpoint()
        return final[-1]

    # --- one step ----------------------------------------------------------------------
    def budget_left(self) -> bool:
        return self.ledger.remaining >= self.G

    def step(self) -> None:
        """Sample one step's rollouts, update the student (and the method's own parts), log it."""
        cfg, ledger, run, method, model, G = self.cfg, self.ledger, self.run, self.method, self.model, self.G
        if self.t_start is None:
            self.t_start, self.r_start = time.perf_counter(), ledger.rollouts
        n_tasks = min(cfg.rollouts_per_step, ledger.remaining) // G
        tasks = self.sampler.next(n_tasks)
        expanded = [t for t in tasks for _ in range(G)]
        groups = [i for i in range(n_tasks) for _ in range(G)]
        contexts = method.student_contexts(expanded)
        t0 = time.perf_counter()
        model.eval()
        rollouts = run_episodes(model, run.encoder, self.domain, expanded, contexts, cfg.sampling(), generator=self.gen)
        model.train()
        t_roll = time.perf_counter() - t0
        ledger.add_rollouts([t.task_id for t in expanded], sum(r.generated_tokens for r in rollouts))
        ledger.add_passes(rollout_tokens=sum(len(r.ids) for r in rollouts))
        t0 = time.perf_counter()
        batch = collate(rollouts, groups, run.encoder.pad_id, run.device)
        step_metrics = _update(method, model, self.optimizer, batch, cfg, ledger)
        step_metrics.update(method.after_step(batch))
        t_update = time.perf_counter() - t0
        ledger.steps += 1
        ledger.tick()
        rec = {
            "kind": "train",
            "step": ledger.steps,
            **ledger.snapshot(),
            **summarize(rollouts, prefix="train_"),
            "rollout_s": round(t_roll, 4),
            "update_s": round(t_update, 4),
            **step_metrics,
        }
        self.metrics.write(rec)
        done_now = ledger.rollouts - self.r_start
        eta = (time.perf_counter() - self.t_start) / max(done_now, 1) * ledger.remaining
        _log(
            f"[{self.label}] step {ledger.steps} rollouts {ledger.rollouts}/{ledger.rollout_budget} "
            f"train_reward {rec['train_reward']:.3f} loss {step_metrics.get('loss', float('nan')):.4f} eta {eta:.0f}s"
        )


def _base_eval(run: RunContext, method: Method, tasks: list[Task], cfg: TrainConfig) -> dict[str, Any] | None:
    """The evaluation before any update, taken from one already made of the base policy where it
    is the same computation: greedy decoding (no random draws), the same held-out tasks and
    evaluation settings, and the same student contexts.  A method whose student sees no context
    at test time reuses the base policy's own (``run.base_eval``, its ``eval.json``); one whose
    student sees contexts reuses a ``run.context_evals`` entry whose ``contexts_sha256`` equals
    the fingerprint of the contexts it would show now (retrieval RL's, from the seeded bank: the
    same for every seed).  The reused evaluation is bit-identical to a recomputed one (checked on
    a code GRPO run, all nine ``heldout_*`` values, and on retrieval RL's three seeds against the
    test-bed probe).  None: evaluate."""
    if cfg.eval_temperature != 0:
        return None
    contexts = method.student_contexts(tasks)
    if all(c is None for c in contexts):
        found = run.base_eval
    else:
        fp = contexts_fingerprint(tasks, contexts, cfg.sampling(eval=True))
        found = next((e for e in run.context_evals if e.get("contexts_sha256") == fp), None)
    if not found or found.get("heldout_episodes") != len(tasks):
        return None
    return {**{k: v for k, v in found.items() if k.startswith("heldout_")}, "eval_reused": True}


def _update(
    method: Method, model, optimizer, batch: RolloutBatch, cfg: TrainConfig, ledger: Ledger
) -> dict[str, float]:
    """PPO-style epochs over minibatches from the same old log-probs.

    The sampler already computed π_old of every sampled token, so by default no
    extra forward pass is spent (on fp32 CPU the two agree to ~1e-6; set
    ``recompute_old_logp`` where inference and training kernels differ, e.g. bf16).
    """
    if cfg.recompute_old_logp:
        with torch.no_grad():
            old_logp, _ = agent_token_logprobs(
                model, batch.input_ids, batch.attention_mask, batch.loss_mask, cfg.temperature
            )
        batch.extras["old_logp"] = old_logp
        ledger.add_passes(student_fwd_tokens=int(batch.attention_mask.sum()))
    else:
        batch.extras["old_logp"] = batch.sample_logp
    sums: dict[str, float] = dict(method.prepare(batch))
    agg: dict[str, float] = {}
    n_updates = 0
    active = method.trainable_rows(batch)
    for _ in range(cfg.ppo_epochs):
        for start in range(0, len(active), cfg.minibatch_rollouts):
            rows = active[start : start + cfg.minibatch_rollouts]
            ids, attn = batch.input_ids[rows], batch.attention_mask[rows]
            width = int(attn.sum(-1).max())  # trim right padding of this minibatch
            logp, logits = agent_token_logprobs(
                model, ids[:, :width], attn[:, :width], rows_of(batch.loss_mask, rows, width - 1), cfg.temperature
            )
            loss, m = method.loss(batch, rows, logp, logits)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            n_tok = int(attn[:, :width].sum())
            ledger.add_passes(student_fwd_tokens=n_tok, student_bwd_tokens=n_tok)
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            m = {"loss": float(loss.detach()), "grad_norm": float(gnorm), **m}
            for k, v in m.items():
                agg[k] = agg.get(k, 0.0) + float(v)
            n_updates += 1
    sums.update({k: v / max(n_updates, 1) for k, v in agg.items()})
    sums.setdefault("loss", 0.0)  # a step with no trainable rows still logs the shared metric names
    sums.setdefault("grad_norm", 0.0)
    sums.update({"updates": n_updates, "trained_rollouts": len(active)})
    return sums


def config_dict(obj) -> dict[str, Any]:
    return asdict(obj)
