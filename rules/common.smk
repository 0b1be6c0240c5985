# Shared definitions: the validated grid and the paths that encode an experiment.
import json
import shlex
import sys

sys.path.insert(0, workflow.basedir)
from methods.core.config import bank_job, profile_section, resolve_job, uses_bank, validate as validate_grid

validate_grid(config)  # every job's settings, before any job starts

PROFILE = config["profile"]
SEEDS = profile_section(config)["seeds"]
DOMAINS = list(config["domains"])
METHODS = list(config["methods"])
OUT = f"results/{PROFILE}"


def job_json(domain, method=None):
    return shlex.quote(json.dumps(resolve_job(config, domain, method), sort_keys=True))
