"""Resolve and validate the suite's configuration (``config/config.yaml``).

One resolver serves the Snakefile (at parse time, so a bad value fails before
any job starts and nothing is written) and the job entry points.  The YAML
names a ``profile``; a profile sets the model, warm start and shared training
settings, with optional per-domain overrides; ``methods`` lists every method
of Table 1, one line each, with its own overrides of its config dataclass.
``ablations`` lists config *variants* of a registered method (``method: lopd``
plus overrides), run under their own names and reported in
``results/<profile>/ablations.csv``; a ``methods`` entry may name ``method:`` too.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import asdict
from typing import Any

from tasks.base import unknown_name

from .registry import get_method, make_config
from .settings import BankConfig, ModelConfig, TrainConfig, WarmStartConfig


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


def profile_domains(config: dict[str, Any]) -> list[str]:
    """The domains this profile runs: its own ``domains`` selection, else the configured ``domains``."""
    return list(profile_section(config).get("domains") or config.get("domains", []))


def profile_methods(config: dict[str, Any]) -> list[str]:
    """Table 1's methods under this profile: its own ``methods`` selection, else every configured one."""
    return list(profile_section(config).get("methods") or config.get("methods", {}))


def profile_ablations(config: dict[str, Any]) -> list[str]:
    """The ablation variants this profile runs: its own ``ablations`` selection, else every configured one."""
    sel = profile_section(config).get("ablations")
    return list(sel) if sel is not None else list(config.get("ablations") or {})


def profile_ablation_domains(config: dict[str, Any]) -> list[str]:
    """The domains the ablations run on: ``ablation_domains`` (default: every domain) among this profile's."""
    domains = profile_domains(config)
    return [d for d in (config.get("ablation_domains") or domains) if d in domains]


def _without_onpolicy(warmstart: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in warmstart.items() if not k.startswith("onpolicy_")}


def _warmstart_job(cfg: WarmStartConfig) -> dict[str, Any]:
    """The warm start's settings; the on-policy stage's fields only when it is on, so that a
    stage that is off leaves the job (Snakemake's params, the runs' provenance) as it was."""
    return asdict(cfg) if cfg.onpolicy_steps else _without_onpolicy(asdict(cfg))


def stage1_job(job: dict[str, Any]) -> dict[str, Any]:
    """A warm start's job without its on-policy stage: what stage 1 is built from, so that
    turning stage 2 on or changing it leaves stage 1's job (and its cached output) as it was."""
    return {**job, "warmstart": _without_onpolicy(job["warmstart"])}


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
        "warmstart": _warmstart_job(make_config(WarmStartConfig, prof.get("warmstart"), "warmstart")),
        "train": asdict(make_config(TrainConfig, prof.get("train"), "train")),
    }
    heldout = (prof.get("heldout_domains") or {}).get(domain)
    if prof.get("backend", "suite") != "suite":  # who trains the runs (docs/verl.md); absent: the suite's loop
        out["backend"] = prof["backend"]
        out["backend_options"] = dict(prof.get("backend_options") or {})
    if heldout:  # evaluated on a benchmark instead of the domain's own test split
        if heldout not in known_domains():
            raise unknown_name("task", heldout, known_domains())
        out["heldout_domain"] = heldout
    if out["model"].get("checkpoint") and out["warmstart"].get("onpolicy_steps"):
        raise ValueError(
            f"{domain}: warmstart.onpolicy_steps applies to the warm starts built here "
            "(stage 1's tokenizer and expert SFT); "
            "a model.checkpoint is its own warm start: set warmstart.onpolicy_steps to 0"
        )
    if method is not None:
        entries = run_entries(config)
        if method not in entries:
            raise unknown_name("method", method, entries)
        where, entry = entries[method]
        entry = dict(entry or {})
        base = entry.pop("method", method)
        cls = get_method(base)
        # profile overrides of the registered method apply to its variants too, then the variant's own
        over = _merge((prof.get("method_overrides") or {}).get(base, {}), entry)
        if base != method:
            over = _merge(over, (prof.get("method_overrides") or {}).get(method, {}))
        out["method"] = base
        if base != method:
            out["run_name"] = method  # a variant runs (and is reported) under its own name
        mcfg = make_config(cls.Config, over, f"{where}.{method}")
        out["method_config"] = asdict(mcfg)
        check_budget(out["train"], mcfg.group_size, where=f"{where}.{method}")
        if cls.uses_bank:
            out["bank"] = bank_settings(prof)
    return out


def run_entries(config: dict[str, Any]) -> dict[str, tuple[str, dict | None]]:
    """Every runnable name -> (section, entry): Table 1's ``methods`` and the ``ablations`` variants."""
    out = {m: ("methods", e) for m, e in (config.get("methods") or {}).items()}
    for m, e in (config.get("ablations") or {}).items():
        if m in out:
            raise ValueError(f"ablations.{m}: the name is already a method of Table 1")
        if not isinstance(e, dict) or "method" not in e:
            raise ValueError(f"ablations.{m} must name the method it varies (method: <name>) plus overrides, got {e!r}")
        out[m] = ("ablations", e)
    return out


def method_class(config: dict[str, Any], name: str):
    """The registered class behind a run name (a Table 1 method or an ablation variant)."""
    entries = run_entries(config)
    if name not in entries:
        raise unknown_name("method", name, entries)
    return get_method((entries[name][1] or {}).get("method", name))


def cold_start_key(config: dict[str, Any], domain: str, name: str) -> str | None:
    """For methods that cold-start (``needs_cold_start``), the key of the cold start this run needs; else None
    (also where the method's config says this variant needs none: ``cold_start_key()`` returns None)."""
    cls = method_class(config, name)
    if not cls.needs_cold_start:
        return None
    return make_config(cls.Config, resolve_job(config, domain, name)["method_config"], name).cold_start_key()


def bank_settings(prof: dict[str, Any]) -> dict[str, Any]:
    """The profile's experience-bank settings (only jobs that use a bank carry them)."""
    return asdict(make_config(BankConfig, prof.get("bank"), "bank"))


def cold_start_runs(config: dict[str, Any], domain: str) -> dict[str, list[str]]:
    """Cold-start key -> the run names that share that cold start (on ``domain``).

    Raises if two runs share a key but differ in a setting the cold start depends on."""
    groups: dict[str, list[str]] = {}
    seen: dict[str, dict] = {}
    for name in run_entries(config):
        key = cold_start_key(config, domain, name)
        if key is None:
            continue
        mc = resolve_job(config, domain, name)["method_config"]
        fields = {f: mc.get(f) for f in method_class(config, name).Config.cold_start_fields}
        if key in seen and seen[key] != fields:
            other = groups[key][0]
            diff = sorted(f for f in fields if fields[f] != seen[key][f])
            raise ValueError(
                f"{name} and {other} share cold start {key} on {domain} but differ in {diff}; "
                "give them the same cold-start settings"
            )
        seen.setdefault(key, fields)
        groups.setdefault(key, []).append(name)
    return groups


def uses_bank(config: dict[str, Any], name: str) -> bool:
    return method_class(config, name).uses_bank


def bank_job(config: dict[str, Any], domain: str) -> dict[str, Any]:
    """Settings of the job that seeds a domain's experience bank from the warm start."""
    prof = profile_section(config)
    prof = _merge(prof, prof.get("domain_overrides", {}).get(domain, {}))
    job = resolve_job(config, domain)
    job["bank"] = bank_settings(prof)
    return job


def profile_digest(config: dict[str, Any], profile: str | None = None) -> str:
    """A digest of everything in the configuration that a profile's results depend on: its seeds,
    and the resolved settings of every job of its grid (warm starts, banks, Table 1's runs and the
    ablations on their domains).  Published results carry it (``analysis/publish.py``), so that a
    configuration change makes them visibly stale instead of passing for current ones."""
    cfg = {**config, "profile": profile or config.get("profile", "small")}
    prof = profile_section(cfg)
    domains = profile_domains(cfg)
    ablation_domains = profile_ablation_domains(cfg)
    grid: dict[str, Any] = {
        "seeds": prof.get("seeds"),
        "base_seed": prof.get("base_seed", 0),
        "task_seed": cfg.get("task_seed", 0),
    }
    if prof.get("base_profile"):  # (only where set: the digests of profiles without one stay as they were)
        grid["base_profile"] = prof["base_profile"]
    for d in domains:
        runs = list(profile_methods(cfg))
        if d in ablation_domains:
            runs += profile_ablations(cfg)
        grid[d] = {"warmstart": resolve_job(cfg, d), **{m: resolve_job(cfg, d, m) for m in runs}}
        if any(uses_bank(cfg, m) for m in runs):
            grid[d]["bank"] = bank_job(cfg, d)
    return hashlib.sha256(json.dumps(grid, sort_keys=True, default=str).encode()).hexdigest()[:16]


def check_budget(train: dict[str, Any], group_size: int, where: str) -> None:
    """Budgets match by construction only if every step is whole groups and the budget is whole steps."""
    for name in ("rollout_budget", "rollouts_per_step"):
        if train[name] % group_size:
            raise ValueError(f"train.{name} ({train[name]}) must be a multiple of {where}.group_size ({group_size})")


def validate(config: dict[str, Any]) -> None:
    """Resolve every job of the configured grid; raises on the first invalid value."""
    from .registry import known_methods

    prof = profile_section(config)
    entries = run_entries(config)
    known = known_methods()
    for m, (_, e) in entries.items():
        base = (e or {}).get("method", m)
        if base not in known:
            raise unknown_name("method", base, known)
    for d in config.get("ablation_domains") or []:
        if d not in config.get("domains", []):
            raise ValueError(f"ablation_domains: {d!r} is not one of domains {config.get('domains')}")
    seeds = prof.get("seeds", [])
    if not seeds or any((not isinstance(s, int)) or s < 0 for s in seeds):
        raise ValueError(
            f"profiles.{config.get('profile')}.seeds must be a non-empty list of non-negative integers, got {seeds}"
        )
    prof_name = config.get("profile")
    for key, known in (
        ("domains", config.get("domains", [])),
        ("methods", list(config.get("methods", {}))),
        ("ablations", list(config.get("ablations") or {})),
    ):
        extra = [x for x in prof.get(key) or [] if x not in known]
        if extra:
            raise ValueError(f"profiles.{prof_name}.{key}: {extra} are not among the configured {key} {known}")
    for d in prof.get("heldout_domains") or {}:
        if d not in profile_domains(config):
            raise ValueError(f"profiles.{prof_name}.heldout_domains: {d!r} is not a domain of this profile")
    for d in config.get("domains", []):
        resolve_job(config, d)
        for m in entries:
            resolve_job(config, d, m)
        cold_start_runs(config, d)
