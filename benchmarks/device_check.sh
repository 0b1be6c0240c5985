#!/usr/bin/env bash
# GPU check of the real profile (issue 19): GRPO and LOPD of SmolLM2-135M-Instruct on the code
# tasks, one seed, a budget of 128 rollouts, HumanEval's first 32 problems before and after, on one
# GPU, through the suite's own pipeline (the `device-check` profile of config/config.yaml), sized
# to take under 10 minutes (never run yet). One job at a time, so that no run shares the GPU
# while it is timed. It reports each run's rollouts/s, wall time and peak GPU memory, and writes
# them to ${OUT:-results/device-check}/device_check.json.
#
#   benchmarks/device_check.sh            # on a GPU machine with the suite installed (pip install -e .)
#   benchmarks/device_check.sh --report   # only the report, from the runs under $RUNS_DIR
#                                         # (default results/device-check/runs)
#
# The profile's policy is results/device-check/model: a link to the converted model, or, where its
# weights are absent (results/models/smollm2-135m-instruct holds only its config and tokenizer) and
# LOPD_RANDOM_INIT=1, the same architecture with random weights (the converted model's folder is
# never written). With random weights the rollouts/s and memory are those of full-length answers
# (a random policy rarely stops early), an upper bound on time per rollout; the rewards mean nothing. Without it the script
# refuses, rather than time a different model silently.
#
# This workplace's lent accelerator machines cannot run it as they are: nothing can be installed
# there beyond what one call carries (64 MiB), and the suite's own needs that their image lacks
# are larger (the experience bank's encoder wheel, 88 MB; faiss, 25 MB; the model, 98 MB as GGUF;
# snakemake, whose dependency connection_pool ships as a source archive only). UNTESTED on a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT:-results/device-check}
RUNS_DIR=${RUNS_DIR:-results/device-check/runs}
MODEL=results/models/smollm2-135m-instruct
mkdir -p "$OUT_DIR"

if [ "${1:-}" != "--report" ]; then
  python - <<'EOF'
import torch
if not torch.cuda.is_available():
    raise SystemExit("device_check: no CUDA device; this check is for one GPU (the CPU slice is profile=real-cpu)")
print(f"device_check: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
EOF
  # the profile's policy (results/device-check/model): the converted model, or the same architecture
  # with random weights; made anew each time, so snakemake reruns what depends on it
  rm -rf results/device-check/model
  mkdir -p results/device-check
  if [ -f "$MODEL/model.safetensors" ]; then
    ln -s ../models/smollm2-135m-instruct results/device-check/model
  elif [ "${LOPD_RANDOM_INIT:-0}" = "1" ] && [ -f "$MODEL/config.json" ]; then
    python - "$MODEL" results/device-check/model <<'EOF'
import sys
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
source, out = sys.argv[1:]
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source))
model.save_pretrained(out)
AutoTokenizer.from_pretrained(source).save_pretrained(out)
print(f"device_check: random weights in {out} ({sum(p.numel() for p in model.parameters()):,} parameters)")
EOF
  else
    echo "device_check: $MODEL has no weights; convert them (snakemake --cores 1 $MODEL), or set" \
      "LOPD_RANDOM_INIT=1 with its config.json and tokenizer there" >&2
    exit 1
  fi
  start=$(date +%s)
  LOPD_DEVICE=cuda snakemake --cores 1 results/device-check/table1.csv \
    --config profile=device-check 2>&1 | tee "$OUT_DIR/snakemake.log"
  echo "device_check: pipeline wall time $(( $(date +%s) - start )) s"
fi

python - "$OUT_DIR" "$RUNS_DIR" <<'EOF'
import json
import sys
from pathlib import Path

rows = []
for summary in sorted(Path(sys.argv[2]).glob("*/*/seed*/summary.json")):
    s = json.loads(summary.read_text())
    led = s["ledger"]
    train_s = max(led["wall_s"] - led.get("eval_wall_s", 0.0), 1e-9)  # the held-out evaluations are the same work for all
    rows.append(
        {
            "method": s["method"],
            "domain": s["domain"],
            "rollouts": led["rollouts"],
            "wall_s": round(led["wall_s"], 1),
            "train_s": round(train_s, 1),
            "rollouts_per_s": round(led["rollouts"] / train_s, 3),
            "generated_tokens_per_s": round(led["generated_tokens"] / train_s, 1),
            "cuda_peak_memory_gib": s.get("cuda_peak_memory_gib"),
            "heldout_reward": s["final"]["heldout_reward"],
        }
    )
if not rows:
    raise SystemExit(f"device_check: no finished runs under {sys.argv[2]}")
for r in rows:
    print(
        f"{r['method']:>6} {r['domain']}: {r['rollouts']} rollouts in {r['train_s']} s of training "
        f"({r['wall_s']} s with evaluations) = {r['rollouts_per_s']} rollouts/s, "
        f"{r['generated_tokens_per_s']} generated tokens/s, peak GPU memory {r['cuda_peak_memory_gib']} GiB, "
        f"held-out reward {r['heldout_reward']:.3f}"
    )
out = Path(sys.argv[1]) / "device_check.json"
out.write_text(json.dumps(rows, indent=2) + "\n")
print(f"device_check: wrote {out}")
EOF
