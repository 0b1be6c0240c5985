"""Target: the suite's GRPO at >= 2x TRL GRPOTrainer's rollouts/s. Prints ratio (suite / TRL); >= 2 meets it.

Training throughput (student rollouts/s) of this suite's GRPO against TRL's ``GRPOTrainer``,
on the code domain, the same warm start, tokenizer, training tasks and number of rollouts.
Target: the suite's rollouts/s >= 2x TRL's.

    python benchmarks/bench_trl_grpo.py --warmstart results/small/warmstart/code --rollouts 320 --threads 1

What is timed (time.perf_counter, one process, the same torch thread count for both):

* suite: its own training loop (``python -m methods.cli train``, ``methods/core/loop.py``) with
  the small profile's resolved GRPO job for code (``resolve_job(config, "code", "grpo")``) and
  ``rollout_budget`` set to ``--rollouts``: the loop's wall time to its last training step,
  less the 8-episode evaluation it runs at rollout 0 (no evaluation or checkpoint in between).
* TRL: ``trainer.train()`` of ``trl.GRPOTrainer`` on CPU with transformers ``generate``
  (no vLLM), the reward function being the code domain's own sandbox scoring of each
  completion on its task.  ``max_steps`` is set so that TRL generates exactly ``--rollouts``
  completions; the reward function counts them.

Excluded on both sides: model/tokenizer load, task generation, trainer construction; TRL's side
also excludes the sandbox's start-up (its worker pool is started before ``train()``).  Both sides
train on the same ``--rollouts / group_size`` training tasks (the suite's task sampler's
first draws, in the same order), from prompts with identical token ids (TRL gets the text of
the suite's prompt ids, checked to re-tokenize to the same ids).

Prints one JSON line: rollouts/s of each side, their ratio (suite / TRL), the target, wall
seconds, rollouts, the settings of both sides, the settings that could not be matched and
the torch / transformers / trl versions.  ``--only suite`` or ``--only trl`` times one side.

The suite's GRPO skips groups whose rewards are all equal (``drop_zero_variance``, most groups
on code), so it takes fewer optimizer steps than TRL, which trains on every rollout; to compare
with that switched off (both sides then do 4 optimizer steps per 32 rollouts)::

    python benchmarks/bench_trl_grpo.py --rollouts 320 --set method_config.drop_zero_variance=false
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET = 2.0

# Settings of the two sides that differ (TRL 1.16 has no equivalent, or differs by design).
UNMATCHED = [
    "old log-probs: the suite reuses the sampler's log-probs (train.recompute_old_logp false); "
    "TRL recomputes them with an extra no-grad forward over each generation batch "
    "(it does whenever num_iterations > 1 or steps_per_generation > gradient_accumulation_steps)",
    "zero-variance groups: the suite skips rollouts whose group has equal rewards "
    "(grpo.drop_zero_variance, no forward/backward on them, token-mean over the rest); "
    "TRL trains on every rollout (advantage 0 there, still in the token-mean's denominator)",
    "dual clip: the suite's PPO loss has verl's dual clip (c = 3 for negative advantages); "
    "TRL's GRPO loss has none (delta=None)",
    "advantage eps: suite (r - mean) / (std + 1e-6), TRL (std + 1e-4); both use the unbiased group std",
    "minibatch order: the suite trains on the step's (trainable) rollouts in order, "
    "2 epochs x minibatches of up to 16; TRL shuffles the generation batch once, "
    "then the same 2 iterations x 2 minibatches of 16 "
    "(4 optimizer steps per 32 rollouts, as the suite when no group is dropped)",
    "generation: the suite's KV-cache engine (methods/core/rollout.py, slab cache, sampler log-probs); "
    "TRL's transformers generate (DynamicCache, disable_compile) "
    "plus TRL's entropy and clip-ratio metrics on every step",
]


def _job(rollouts: int, overrides: list[str]) -> dict:
    from benchmarks.bench_grpo_run import resolve

    # no evaluation or checkpoint inside the timed steps (the loop still evaluates at rollout 0 and at the end)
    train = {"rollout_budget": rollouts, "eval_episodes": 8, "checkpoint_every": 10**6}
    train["eval_every"] = rollouts + resolve("code", "grpo")["train"]["rollouts_per_step"]
    try:
        return resolve("code", "grpo", "small", overrides, train)
    except ValueError as e:
        raise SystemExit(str(e)) from None


def _unmatched(job: dict) -> list[str]:
    m, t = job["method_config"], job["train"]
    out = [u for u in UNMATCHED if not u.startswith(("old log-probs", "zero-variance"))]
    if not t["recompute_old_logp"]:
        out.insert(0, next(u for u in UNMATCHED if u.startswith("old log-probs")))
    if m["drop_zero_variance"]:
        out.insert(1, next(u for u in UNMATCHED if u.startswith("zero-variance")))
    if m["loss_agg"] != "token-mean":
        out.append(f"loss aggregation: suite {m['loss_agg']}, TRL bnpo (token-mean per minibatch)")
    return out


class _Timer:
    """Accumulated wall time of calls to a wrapped function."""

    def __init__(self):
        self.s = 0.0
        self.first: float | None = None  # perf_counter at the first call

    def wrap(self, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            if self.first is None:
                self.first = t0
            try:
                return fn(*args, **kwargs)
            finally:
                self.s += time.perf_counter() - t0

        return timed


def _training_tasks(domain, seed: int, n_tasks: int):
    """The first ``n_tasks`` draws of the suite's task sampler: what the loop trains on."""
    from methods.core.loop import TaskSampler

    return TaskSampler(domain.tasks("train"), seed).next(n_tasks)


def _warm_sandbox(domain, task) -> None:
    """Start the sandbox worker pool (both sides share it) outside the timed parts."""
    ep = domain.reset(task)
    domain.step_batch([ep], [task.reference])


def run_suite(job: dict, warmstart: Path, seed: int) -> dict:
    """The suite's own training loop (``python -m methods.cli train``) for the budget.

    Timed: the loop from its start to the last training step (``wall_s`` of the last
    train record), less the 8-episode held-out evaluation the loop runs at rollout 0;
    the final evaluation and checkpoint come after it and are not counted."""
    from benchmarks.bench_grpo_run import run_job
    from methods.core.loop import TrainConfig
    from methods.core.registry import get_method, make_config

    mcfg = make_config(get_method("grpo").Config, job["method_config"], "methods.grpo")
    cfg = make_config(TrainConfig, job["train"], "train")
    recs, _ = run_job(job, seed, warmstart, threads=torch.get_num_threads())
    trains = [r for r in recs if r["kind"] == "train"]
    evals_before = sum(r["eval_s"] for r in recs if r["kind"] == "eval" and r["rollouts"] == 0)
    return {
        "rollouts": trains[-1]["rollouts"],
        "wall_s": trains[-1]["wall_s"] - evals_before,
        "rollout_s": sum(r["rollout_s"] for r in trains),
        "update_s": sum(r["update_s"] for r in trains),
        "steps": len(trains),
        "optimizer_steps": sum(r.get("updates", 0) for r in trains),
        "trained_rollouts": sum(r.get("trained_rollouts", 0) for r in trains),
        "generated_tokens": trains[-1]["generated_tokens"],
        "mean_train_reward": sum(r["train_reward"] for r in trains) / len(trains),
        "settings": {
            "group_size": mcfg.group_size,
            "rollouts_per_step": cfg.rollouts_per_step,
            "ppo_epochs": cfg.ppo_epochs,
            "minibatch_rollouts": cfg.minibatch_rollouts,
            "lr": cfg.lr,
            "lr_schedule": "constant",
            "weight_decay": cfg.weight_decay,
            "grad_clip": cfg.grad_clip,
            "temperature": cfg.temperature,
            "max_new_tokens": cfg.max_new_tokens,
            "max_seq_len": cfg.max_seq_len,
            "clip_low": mcfg.clip_low,
            "clip_high": mcfg.clip_high,
            "dual_clip_c": 3.0,
            "kl_coef": 0.0,
            "loss_agg": mcfg.loss_agg,
            "norm_by_std": mcfg.norm_by_std,
            "drop_zero_variance": mcfg.drop_zero_variance,
            "recompute_old_logp": cfg.recompute_old_logp,
            "optimizer": "torch AdamW",
        },
    }


def run_trl(job: dict, warmstart: Path, seed: int) -> dict:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from methods.core.loop import TrainConfig
    from methods.core.policy import load_policy
    from methods.core.registry import get_method, make_config
    from methods.core.rollout import initial_prompt_ids
    from methods.core.tokenizer import ChatEncoder
    from tasks.base import get_domain

    mcfg = make_config(get_method("grpo").Config, job["method_config"], "methods.grpo")
    cfg = make_config(TrainConfig, job["train"], "train")
    G = mcfg.group_size
    n_rollouts = cfg.rollout_budget // G * G
    domain = get_domain("code", seed=job["task_seed"], **job["domain_options"])
    tasks = _training_tasks(domain, seed, n_rollouts // G)
    model, tokenizer = load_policy(warmstart / "model")
    enc = ChatEncoder(tokenizer)
    prompt_ids = [initial_prompt_ids(enc, domain, t, None) for t in tasks]
    prompts = [tokenizer.decode(ids, skip_special_tokens=False) for ids in prompt_ids]
    retok = tokenizer(text=prompts)["input_ids"]  # how TRL tokenizes a text prompt
    if [list(x) for x in retok] != prompt_ids:
        raise SystemExit("TRL's tokenization of the rendered prompts differs from the suite's prompt ids")
    dataset = Dataset.from_dict({"prompt": prompts, "task_index": list(range(len(tasks)))})

    counts = {"calls": 0, "completions": 0, "reward_sum": 0.0, "tokens": 0}
    sandbox, generate, gen_score = _Timer(), _Timer(), _Timer()
    domain.step_batch = sandbox.wrap(domain.step_batch)

    def code_reward(prompts, completions, completion_ids, task_index, **kwargs):
        """The code domain's reward: the completion's program against the task's hidden tests in the sandbox."""
        episodes = [domain.reset(tasks[i]) for i in task_index]
        domain.step_batch(episodes, list(completions))
        out = [ep.reward() for ep in episodes]
        counts["calls"] += 1
        counts["completions"] += len(out)
        counts["reward_sum"] += sum(out)
        counts["tokens"] += sum(len(c) for c in completion_ids)
        return out

    per_device = cfg.minibatch_rollouts
    steps_per_generation = cfg.rollouts_per_step // per_device
    optimizer_steps_per_generation = steps_per_generation * cfg.ppo_epochs
    max_steps = n_rollouts // cfg.rollouts_per_step * optimizer_steps_per_generation
    if n_rollouts % cfg.rollouts_per_step:
        raise SystemExit(f"--rollouts must be a multiple of {cfg.rollouts_per_step} for TRL's fixed generation batch")
    settings = dict(
        use_cpu=True,
        bf16=False,
        fp16=False,
        report_to="none",
        save_strategy="no",
        logging_strategy="steps",
        logging_steps=max_steps,
        disable_tqdm=True,
        log_completions=False,
        gradient_checkpointing=False,
        seed=seed,
        data_seed=seed,
        shuffle_dataset=False,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        learning_rate=cfg.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.grad_clip,
        optim="adamw_torch",
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=1,
        generation_batch_size=cfg.rollouts_per_step,
        num_generations=G,
        num_iterations=cfg.ppo_epochs,
        max_steps=max_steps,
        max_completion_length=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        epsilon=mcfg.clip_low,
        epsilon_high=mcfg.clip_high,
        loss_type="bnpo",
        scale_rewards="group" if mcfg.norm_by_std else "none",
        mask_truncated_completions=False,
        use_vllm=False,
    )
    _warm_sandbox(domain, domain.tasks("train")[0])
    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(output_dir=out, **settings)
        trainer = GRPOTrainer(
            model=model, reward_funcs=code_reward, args=args, train_dataset=dataset, processing_class=tokenizer
        )
        # where the time goes: transformers generate, and the whole rollout phase (generate, sandbox reward,
        # old log-prob forward, advantages); the rest of train() is the update phase
        trainer.model.generate = generate.wrap(trainer.model.generate)
        trainer._generate_and_score_completions = gen_score.wrap(trainer._generate_and_score_completions)
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr):  # TRL prints its log dicts: keep stdout to the one JSON line
            result = trainer.train()
        wall = time.perf_counter() - t0
        global_step = trainer.state.global_step
    domain.close()
    if counts["completions"] != n_rollouts:
        raise SystemExit(f"TRL generated {counts['completions']} rollouts, expected {n_rollouts}")
    return {
        "rollouts": counts["completions"],
        "wall_s": wall,
        "generate_and_score_s": gen_score.s,
        "generate_s": generate.s,
        "sandbox_s": sandbox.s,
        "update_s": wall - gen_score.s - ((gen_score.first or t0) - t0),
        "setup_in_train_s": (gen_score.first or t0) - t0,
        "reward_calls": counts["calls"],
        "optimizer_steps": global_step,
        "generated_tokens": counts["tokens"],
        "mean_train_reward": counts["reward_sum"] / max(counts["completions"], 1),
        "train_loss": result.training_loss,
        "settings": {k: v for k, v in settings.items() if k not in ("report_to", "disable_tqdm", "logging_strategy")},
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--warmstart", default="results/small/warmstart/code", help="warm start directory (holds model/)")
    p.add_argument("--rollouts", type=int, default=320, help="student rollouts per side (default 320: 10 steps of 32)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (both sides)")
    p.add_argument("--only", choices=["suite", "trl", "both"], default="both")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a resolved setting for both sides (sections: train, method_config), "
        "e.g. method_config.drop_zero_variance=false",
    )
    a = p.parse_args(argv)
    torch.set_num_threads(max(1, a.threads))
    warmstart = Path(a.warmstart)
    job = _job(a.rollouts, a.set)
    if a.rollouts % job["train"]["rollouts_per_step"]:
        p.error(f"--rollouts must be a multiple of {job['train']['rollouts_per_step']} (the rollouts per step)")

    import transformers
    import trl

    out: dict = {
        "domain": "code",
        "profile": "small",
        "warmstart": str(warmstart),
        "threads": torch.get_num_threads(),
        "target": TARGET,
    }
    suite = run_suite(job, warmstart, a.seed) if a.only in ("suite", "both") else None
    trl_res = run_trl(job, warmstart, a.seed) if a.only in ("trl", "both") else None
    if suite:
        out["suite_rollouts_per_s"] = round(suite["rollouts"] / suite["wall_s"], 3)
    if trl_res:
        out["trl_rollouts_per_s"] = round(trl_res["rollouts"] / trl_res["wall_s"], 3)
    if suite and trl_res:
        out["ratio"] = round(out["suite_rollouts_per_s"] / out["trl_rollouts_per_s"], 3)
        out["meets_target"] = out["ratio"] >= TARGET
    for name, res in (("suite", suite), ("trl", trl_res)):
        if res:
            out[f"{name}_rollouts"] = res["rollouts"]
            out[f"{name}_wall_s"] = round(res["wall_s"], 2)
    if suite:
        out["suite"] = {
            k: (round(v, 4) if isinstance(v, float) else v) for k, v in suite.items() if k not in ("rollouts", "wall_s")
        }
    if trl_res:
        out["trl"] = {
            k: (round(v, 4) if isinstance(v, float) else v)
            for k, v in trl_res.items()
            if k not in ("rollouts", "wall_s")
        }
    out["overrides"] = a.set
    out["unmatched"] = _unmatched(job)
    out["timed"] = (
        "suite: its training loop to the last step, less the rollout-0 evaluation; trl: trainer.train(). "
        "Excluded: model load, task generation, trainer construction; "
        "no held-out evaluation or checkpoint inside either"
    )
    out["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__}
    out["threads_after"] = torch.get_num_threads()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
