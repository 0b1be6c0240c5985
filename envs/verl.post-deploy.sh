#!/usr/bin/env bash
# Snakemake's post-deployment script for envs/verl.yaml: it runs this in the environment right after
# creating it. What pip's requirement lists cannot say: distributions installed without their declared
# dependencies. bfcl-eval pins numpy 1.26.4 (vLLM 0.24 needs numpy 2.x) and requires every LLM SDK; what
# tasks/bfcl.py uses of it (the multi-turn checker and simulators) imports mpmath and the standard
# library only, and mpmath is in envs/verl.lock.txt (tests/test_envs.py follows those imports).
set -euo pipefail
python -m pip install --no-deps bfcl-eval==2026.3.23
