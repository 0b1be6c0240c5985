"""GRPO specifics beyond the verl oracle tests: which rollouts train, and no empty steps."""

from __future__ import annotations

import torch

from methods.grpo import GRPOConfig, groups_with_variance


def test_groups_with_variance():
    rewards = torch.tensor([0.0, 0.0, 1.0, 1.0, 0.5, 0.0, 0.3, 0.3])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    assert groups_with_variance(rewards, groups).tolist() == [False, False, False, False, True, True, False, False]


def test_config_defaults_are_the_papers():
    c = GRPOConfig()
    assert c.group_size == 4 and c.clip_low == 0.2 and c.clip_high == 0.2 and c.norm_by_std


def test_a_step_without_reward_variance_leaves_the_policy_untouched(warmstarts, tmp_path):
    """All groups tied: no rollout carries signal, so no optimizer step (Adam would drift on momentum)."""
    import json

    from methods.core.ledger import Ledger
    from methods.core.loop import RunContext, train
    from methods.core.policy import load_policy
    from methods.core.registry import get_method
    from methods.core.tokenizer import ChatEncoder
    from tasks.base import get_domain

    from .conftest import tiny_configs

    _, _, cfg = tiny_configs()
    ws, _ = warmstarts["tooluse"]
    model, tok = load_policy(ws / "model")
    domain = get_domain("tooluse", seed=0)
    orig_reset = domain.reset

    def reset_zero(task):  # every episode scores 0
        ep = orig_reset(task)
        ep.reward = lambda: 0.0
        return ep

    domain.reset = reset_zero
    run = RunContext(
        model=model,
        tokenizer=tok,
        encoder=ChatEncoder(tok),
        domain=domain,
        train_cfg=cfg,
        ledger=Ledger(cfg.rollout_budget),
        seed=0,
        device=torch.device("cpu"),
    )
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cls = get_method("grpo")
    train(cls(cls.Config(), run), run, tmp_path)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    steps = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines() if '"train"' in x]
    assert [s["updates"] for s in steps] == [0, 0] and all(s["zero_variance_share"] == 1.0 for s in steps)
