"""Shared fixtures: tiny warm-started policies per domain, built once per session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
torch.set_num_threads(1)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

DOMAINS = ["tooluse", "code"]


def tiny_configs():
    from methods.core.loop import TrainConfig
    from methods.core.policy import ModelConfig
    from methods.stages.warmstart import WarmStartConfig

    model = ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    ws = WarmStartConfig(
        vocab_size=400, n_demos=120, steps=4, batch_size=8, lr=3e-3, warmup_steps=1, likelihood_tasks=8
    )
    train = TrainConfig(
        rollout_budget=16,
        rollouts_per_step=8,
        eval_every=8,
        eval_episodes=6,
        ppo_epochs=1,
        minibatch_rollouts=8,
        checkpoint_every=1,
        max_new_tokens=16,
        max_seq_len=1024,
    )  # 1024: room for three retrieved trajectories in a prompt
    return model, ws, train


@pytest.fixture(scope="session")
def warmstarts(tmp_path_factory):
    """{domain: (Path, report)} of tiny warm-start directories (model/ + the warm start's report).

    Built once per test session: under pytest-xdist the workers share one directory, each worker
    starts with a different domain under that domain's file lock, and the others reuse what it
    saved (the build is deterministic; it takes about 13 s per domain)."""
    import json

    from filelock import FileLock

    from methods.core.policy import save_policy
    from methods.stages.warmstart import warm_start
    from tasks.base import get_domain

    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    root = tmp_path_factory.getbasetemp()
    root = root.parent if worker else root  # xdist: the workers' base directories share a parent
    turn = int(worker[2:] or 0) if worker.startswith("gw") else 0
    order = DOMAINS[turn % len(DOMAINS) :] + DOMAINS[: turn % len(DOMAINS)]
    model_cfg, ws_cfg, train_cfg = tiny_configs()
    out = {}
    for name in order:
        path = root / f"ws_{name}"
        done = path / "report.json"
        with FileLock(str(path) + ".lock"):
            if not done.exists():
                d = get_domain(name, seed=0)
                model, tok, report = warm_start(
                    d, model_cfg, ws_cfg, train_cfg.sampling(eval=True), train_cfg.eval_episodes, seed=0
                )
                d.close()
                save_policy(model, tok, path / "model")
                done.write_text(json.dumps(report))
        out[name] = (path, json.loads(done.read_text()))
    return {name: out[name] for name in DOMAINS}


class _VariedEpisode:
    """Proxy of a real episode whose reward also depends on the text generated,
    so that an untrained tiny policy still sees reward variance within a group."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def step(self, action):
        return self._inner.step(action)

    def reward(self):
        text = "".join(t.action for t in self._inner.turns)
        return min(1.0, self._inner.reward() + (sum(map(ord, text)) % 3) / 2)


def varied_reward_domain(inner):
    """Wrap a domain for the contract tests: same tasks and episodes, rewards with variance."""
    from tasks.base import TaskDomain

    class Varied(TaskDomain):
        name = inner.name
        version = inner.version
        system_prompt = inner.system_prompt

        def tasks(self, split, n=None):
            return inner.tasks(split, n)

        def reset(self, task):
            return _VariedEpisode(inner.reset(task))

        def step_batch(self, episodes, actions):
            return inner.step_batch([e._inner for e in episodes], actions)

        def close(self):
            inner.close()

    return Varied(seed=inner.seed, **inner.options)


def tiny_run(ws_path: Path, domain_name: str = "tooluse", train_cfg=None, out_dir: Path | None = None):
    """A RunContext on a tiny warm start (the domain wrapped so an untrained policy sees reward variance)."""
    from methods.core.ledger import Ledger
    from methods.core.loop import RunContext
    from methods.core.policy import load_policy
    from methods.core.tokenizer import ChatEncoder
    from tasks.base import get_domain

    train_cfg = train_cfg or tiny_configs()[2]
    model, tok = load_policy(ws_path / "model")
    return RunContext(
        model=model,
        tokenizer=tok,
        encoder=ChatEncoder(tok),
        domain=varied_reward_domain(get_domain(domain_name, seed=0)),
        train_cfg=train_cfg,
        ledger=Ledger(train_cfg.rollout_budget),
        seed=0,
        device=torch.device("cpu"),
        warmstart_path=ws_path,
        out_dir=out_dir,
    )


@pytest.fixture(scope="session")
def seeded_banks(tmp_path_factory):
    """{domain: Path} of experience banks seeded with the scripted expert's trajectories of 40
    training tasks (what the ``bank`` rule does with the warm start's own successes)."""
    from methods.experience import BankConfig, ExperienceBank
    from methods.experience.encoder import TextEncoder
    from tasks.base import get_domain

    out = {}
    for name in DOMAINS:
        d = get_domain(name, seed=0)
        bank = ExperienceBank(BankConfig(), TextEncoder())
        tasks = d.tasks("train", 40)
        bank.add([(t, d.expert_trajectory(t).turns, 1.0) for t in tasks], step=-1)
        path = tmp_path_factory.mktemp(f"bank_{name}") / "bank.pt"
        bank.save(path)
        out[name] = path
    return out


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` need a CUDA device: skipped where there is none."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (marker gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
