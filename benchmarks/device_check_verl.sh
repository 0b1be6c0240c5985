#!/usr/bin/env bash
# Check: five methods through verl's main_ppo on a GPU (issue 20); every status ok (exit 0) passes.
# GPU check of the verl backend (issues 20, 40): GRPO, OPSD, SDFT, SDPO and Skill-SD through verl's main_ppo with a
# small model built from a config, a few steps each, one GPU, and the suite's run files checked complete.
# Run it in envs/verl.yaml's
# environment with the suite installed (pip install --no-deps -e .). Writes its work and
# device_check_verl.json under ${OUT:-results/device-check-verl}. benchmarks/device_check_verl.py
# says what each step is; `--dry-run` does everything up to launching verl, on CPU.
# UNTESTED on a GPU so far (docs/verl.md).
set -euo pipefail
cd "$(dirname "$0")/.."
exec python benchmarks/device_check_verl.py "$@"
