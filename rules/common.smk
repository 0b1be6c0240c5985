# Shared definitions: the validated grid and the paths that encode an experiment.
import functools
import os
import json
import shlex
import sys

sys.path.insert(0, workflow.basedir)
from methods.stages.shipped import matches as shipped_matches, shipped_dir
from methods.core.config import (
    bank_job,
    cold_start_key,
    cold_start_runs,
    profile_ablation_domains,
    profile_ablations,
    profile_domains,
    profile_methods,
    profile_section,
    resolve_job,
    stage1_job,
    uses_bank,
    validate as validate_grid,
)

validate_grid(config)  # every job's settings, before any job starts

PROFILE = config["profile"]
SEEDS = profile_section(config)["seeds"]  # RL seeds
BASE_SEED = profile_section(config).get("base_seed", 0)  # the seed of the one base policy per domain
DOMAINS = profile_domains(config)  # the profile's selection, else every configured domain
METHODS = profile_methods(config)  # Table 1's methods: the profile's selection, else every configured one
ABLATIONS = profile_ablations(config)  # the profile's selection, else every configured variant
ABLATION_DOMAINS = profile_ablation_domains(config)  # ablation_domains among the profile's domains
OUT = f"results/{PROFILE}"  # every output of this profile
FOCUS = config["focus_method"]  # the method reproduced (LOPD): its ablations, improvement, dynamics, diagnosis
REFERENCE = config["reference_method"]  # the baseline rollouts-to-target is read against
# whose shipped base policies (results/base/<profile>/) this profile installs: its own unless it names another
BASE_PROFILE = profile_section(config).get("base_profile", PROFILE)
BACKEND = profile_section(config).get(
    "backend", "suite"
)  # who trains the runs: the suite's loop, or verl (rules/verl.smk)
BACKEND_OPTIONS = profile_section(config).get("backend_options") or {}
HEADLINE = config.get("headline_profile", PROFILE)
# The jobs that import torch run `python -m methods.core.forkserver methods.cli ...`: they start from a warm
# process that has imported torch and transformers already (methods/core/forkserver.py;
# LOPD_FORKSERVER=0 starts each as a fresh interpreter).  # the profile results/table1.* and results/report.md show


wildcard_constraints:
    domain=r"[^/]+",
    method=r"[^/]+",


@functools.cache  # the config is fixed while Snakemake parses: each job is resolved once
def job_of(domain, method=None):
    return resolve_job(config, domain, method)


def job_json(domain, method=None, stage1=False):
    job = job_of(domain, method)
    return shlex.quote(json.dumps(stage1_job(job) if stage1 else job, sort_keys=True))


_SHIPPED = {}


def shipped_path(domain):
    return str(shipped_dir(BASE_PROFILE, domain))


def shipped_base(domain):
    """The shipped base policy directory if it is exactly what this profile would build, else None.
    A profile that names another's base policies (base_profile) must fit them: it is refused otherwise."""
    if domain not in _SHIPPED:
        from tasks.base import get_domain

        job = job_of(domain)
        d = get_domain(domain, seed=job["task_seed"], **job["domain_options"])
        path, why = shipped_matches(BASE_PROFILE, domain, job, BASE_SEED, d.version)
        d.close()
        if BASE_PROFILE != PROFILE and not path:
            raise ValueError(
                f"profile {PROFILE} installs the base policies of profile {BASE_PROFILE} (base_profile), but "
                f"{shipped_path(domain)} "
                + (f"was built with other {why}" if why else "holds none")
                + f": give {PROFILE} {BASE_PROFILE}'s model, warm-start and sampling settings, or drop base_profile"
            )
        if why:
            print(
                f"note: the shipped base policy {shipped_path(domain)} was built with other {why}; training the {domain} base policy instead",
                file=sys.stderr,
            )
        _SHIPPED[domain] = str(path) if path else None
    return _SHIPPED[domain]


@functools.cache
def _cold_start_key(domain, method):
    return cold_start_key(config, domain, method)


def coldstart_path(domain, method, seed):
    """The cold-started composer a run starts from ([] for methods without one)."""
    key = _cold_start_key(domain, method)
    return [f"{OUT}/coldstart/{domain}/{key}/seed{seed}/composer.pt"] if key else []


def coldstart_job(domain, key):
    """Any run sharing cold start ``key`` has the same cold-start settings (checked by validate_grid)."""
    return job_json(domain, cold_start_runs(config, domain)[key][0])


def testbed_n_retrieve(domain):
    """The n_retrieve of the first of the profile's methods that reads the bank (retrieval RL: the
    experience check hands the base policy its context); 3 where none does."""
    readers = [m for m in METHODS if uses_bank(config, m)]
    return job_of(domain, readers[0])["method_config"]["n_retrieve"] if readers else 3


def testbed_uses_bank(domain):
    """The experience rows of the test-bed probe need the bank only where a method reads one."""
    return any(uses_bank(config, m) for m in METHODS)
