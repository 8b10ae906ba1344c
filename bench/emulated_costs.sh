#!/usr/bin/env bash
# GPU costs counted without a GPU: per training step of configs/gpt2_124m_pp4.yaml's model at
# pp=1 (bf16, CUDA backend) on the emulated CUDA device, the host synchronizations,
# device-wide synchronizations, bytes memset, host-to-device and device-to-host bytes, kernel
# launches and GEMM calls, without tracing (trace_steps=0: a traced step waits for its timed
# events). Per step = (a run of 3 steps - a run of 2 steps), so start-up, the
# first step's allocations and the evaluations cancel. The micro-batch is 1 x 64 tokens (the
# emulated device runs every GPU thread as a fiber on the CPU): the counts of launches, GEMMs and
# synchronizations do not depend on it; bytes scale with it.
#
#   bench/emulated_costs.sh            prints the table (about 2 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bazel build //core/cli:bigmac_emulated //:bigmac >/dev/null 2>&1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
corpus=$(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.*' | sort)
bazel-bin/bigmac data prep --input $corpus --output "$work/data" >/dev/null

run() {  # steps -> counters JSON
  BIGMAC_EMULATED_COUNTERS="$work/counters_$1.json" bazel-bin/core/cli/bigmac_emulated train \
    --config configs/gpt2_124m_pp4.yaml --set data.dir="$work/data" --set parallel.pp_size=1 \
    --set parallel.num_microbatches=1 --set train.gradient_accumulation_steps=1 \
    --set model.layers_per_stage=[12] --set train.micro_batch_size=1 --set train.seq_length=64 \
    --set train.max_steps="$1" --set train.eval_interval=0 --set train.eval_batches=1 \
    --set train.log_interval=1 --set train.trace_steps=0 --set train.output_dir="$work/run_$1" \
    --overwrite \
    >"$work/log_$1.txt" 2>&1 || { cat "$work/log_$1.txt" >&2; exit 1; }
}
run 2
run 3
python3 - "$work/counters_2.json" "$work/counters_3.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
print("emulated CUDA device, gpt2_124m_pp4 model at pp=1, bf16, micro-batch 1x64: per training step")
print(f"{'counter':28s} {'per step':>14s}")
for key in a:
    print(f"{key:28s} {b[key] - a[key]:>14,d}")
PY
