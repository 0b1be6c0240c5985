#!/usr/bin/env bash
# Resolve the verl backend's environment: envs/verl.in -> envs/verl.lock.txt, for linux x86_64 with
# CUDA (PyPI's torch 2.11.0 wheels for linux are its CUDA 13.0 build) and Python 3.11 (envs/verl.yaml's),
# then write the lock's pins into envs/verl.yaml's pip section, which conda installs.
#
#   envs/lock_verl.sh              re-resolve and rewrite envs/verl.lock.txt and envs/verl.yaml
#   envs/lock_verl.sh --out FILE   re-resolve into FILE only (tests/test_envs.py compares it with the lock)
#
# Needs uv (`pip install uv`) and PyPI. EXCLUDE_NEWER fixes the resolution to what PyPI held at that time,
# so a re-run gives the same lock; move it forward (and re-run) to take newer releases.
set -euo pipefail
EXCLUDE_NEWER="2026-12-07T00:00:00Z"
here="$(cd "$(dirname "$0")" && pwd)"
out="$here/verl.lock.txt"
write_yaml=1
if [ "${1:-}" = "--out" ]; then
    out="$2"
    write_yaml=0
fi
cd "$here"
uv pip compile verl.in \
    --python-platform x86_64-manylinux_2_28 \
    --python-version 3.11 \
    --default-index https://pypi.org/simple \
    --exclude-newer "$EXCLUDE_NEWER" \
    --no-config \
    --custom-compile-command "envs/lock_verl.sh" \
    --quiet \
    -o "$out"
if [ "$write_yaml" = 1 ]; then
    python3 - "$here/verl.yaml" "$out" <<'EOF'
import re
import sys

yaml_path, lock_path = sys.argv[1:]
pins = [line.strip() for line in open(lock_path) if re.match(r"[A-Za-z0-9]", line)]
text = open(yaml_path).read()
head, marker, _ = text.partition("  - pip:  # envs/verl.lock.txt's pins, written by envs/lock_verl.sh\n")
if not marker:
    sys.exit(f"{yaml_path}: no pip section written by envs/lock_verl.sh")
open(yaml_path, "w").write(head + marker + "".join(f"      - {p}\n" for p in pins))
print(f"{yaml_path}: {len(pins)} pins from {lock_path}")
EOF
fi
