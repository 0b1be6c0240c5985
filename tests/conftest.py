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
    from methods.core.warmstart import WarmStartConfig

    model = ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, vocab_size=400)
    ws = WarmStartConfig(n_demos=120, steps=4, batch_size=8, lr=3e-3, warmup_steps=1, likelihood_tasks=8)
    train = TrainConfig(rollout_budget=16, rollouts_per_step=8, eval_every=8, eval_episodes=6, ppo_epochs=1, minibatch_rollouts=8, checkpoint_every=1, max_new_tokens=16, max_seq_len=512)
    return model, ws, train


@pytest.fixture(scope="session")
def warmstarts(tmp_path_factory):
    """{domain: Path} of tiny warm-start directories (model/ + eval.json)."""
    from methods.core.policy import save_policy
    from methods.core.warmstart import warm_start
    from tasks.base import get_domain

    model_cfg, ws_cfg, train_cfg = tiny_configs()
    out = {}
    for name in DOMAINS:
        d = get_domain(name, seed=0)
        model, tok, report = warm_start(d, model_cfg, ws_cfg, train_cfg.sampling(eval=True), train_cfg.eval_episodes, seed=0)
        path = tmp_path_factory.mktemp(f"ws_{name}")
        save_policy(model, tok, path / "model")
        out[name] = (path, report)
    return out
