"""Resolve and validate the suite's configuration (``config/config.yaml``).

One resolver serves the Snakefile (at parse time, so a bad value fails before
any job starts and nothing is written) and the job entry points.  The YAML
names a ``profile``; a profile sets the model, warm start and shared training
settings, with optional per-domain overrides; ``methods`` lists every method
of Table 1, one line each, with its own overrides of its config dataclass.
"""

from __future__ import annotations

import copy
from dataclasses import asdict
from typing import Any

from tasks.base import unknown_name

from .loop import TrainConfig
from .policy import ModelConfig
from .registry import get_method, make_config
from .warmstart import WarmStartConfig


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def profile_section(config: dict[str, Any]) -> dict[str, Any]:
    name = config.get("profile", "small")
    profiles = config.get("profiles", {})
    if name not in profiles:
        raise unknown_name("profile", name, profiles)
    return profiles[name]


def resolve_job(config: dict[str, Any], domain: str, method: str | None = None) -> dict[str, Any]:
    """The validated, fully resolved settings of one job (a warm start if ``method`` is None)."""
    from tasks.base import known_domains

    if domain not in known_domains():
        raise unknown_name("task", domain, known_domains())
    prof = profile_section(config)
    prof = _merge(prof, prof.get("domain_overrides", {}).get(domain, {}))
    out = {
        "profile": config.get("profile", "small"),
        "domain": domain,
        "task_seed": int(config.get("task_seed", 0)),
        "domain_options": dict(prof.get("domain_options", {})),
        "model": asdict(make_config(ModelConfig, prof.get("model"), "model")),
        "warmstart": asdict(make_config(WarmStartConfig, prof.get("warmstart"), "warmstart")),
        "train": asdict(make_config(TrainConfig, prof.get("train"), "train")),
    }
    if method is not None:
        methods = config.get("methods") or {}
        if method not in methods:
            raise unknown_name("method", method, methods)
        cls = get_method(method)
        over = _merge(methods.get(method) or {}, (prof.get("method_overrides") or {}).get(method, {}))
        out["method"] = method
        mcfg = make_config(cls.Config, over, f"methods.{method}")
        out["method_config"] = asdict(mcfg)
        check_budget(out["train"], mcfg.group_size, where=f"methods.{method}")
        if cls.uses_bank:
            out["bank"] = bank_settings(prof)
    return out


def bank_settings(prof: dict[str, Any]) -> dict[str, Any]:
    """The profile's experience-bank settings (only jobs that use a bank carry them)."""
    from methods.experience.bank import BankConfig

    return asdict(make_config(BankConfig, prof.get("bank"), "bank"))


def uses_bank(method: str) -> bool:
    return get_method(method).uses_bank


def bank_job(config: dict[str, Any], domain: str) -> dict[str, Any]:
    """Settings of the job that seeds a domain's experience bank from the warm start."""
    prof = profile_section(config)
    prof = _merge(prof, prof.get("domain_overrides", {}).get(domain, {}))
    job = resolve_job(config, domain)
    job["bank"] = bank_settings(prof)
    return job


def check_budget(train: dict[str, Any], group_size: int, where: str) -> None:
    """Budgets match by construction only if every step is whole groups and the budget is whole steps."""
    for name in ("rollout_budget", "rollouts_per_step"):
        if train[name] % group_size:
            raise ValueError(f"train.{name} ({train[name]}) must be a multiple of {where}.group_size ({group_size})")


def validate(config: dict[str, Any]) -> None:
    """Resolve every job of the configured grid; raises on the first invalid value."""
    from .registry import known_methods

    prof = profile_section(config)
    for m in config.get("methods") or {}:
        if m not in known_methods():
            raise unknown_name("method", m, known_methods())
    seeds = prof.get("seeds", [])
    if not seeds or any((not isinstance(s, int)) or s < 0 for s in seeds):
        raise ValueError(f"profiles.{config.get('profile')}.seeds must be a non-empty list of non-negative integers, got {seeds}")
    for d in config.get("domains", []):
        resolve_job(config, d)
        for m in config.get("methods") or {}:
            resolve_job(config, d, m)
