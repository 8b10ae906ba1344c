#!/usr/bin/env bash
# The demo: train a small character-level GPT on real English text (the fortunes corpus) on one
# CPU rank, look at its TensorBoard file and generate text from its checkpoint; in shorter runs of
# 150 steps each, the same GPT in fp32 and bf16, a llama of its size (both validation losses,
# generate from the llama) and a SentencePiece vocabulary (bits per byte compared); simulate
# pipeline schedules; train a 4-stage pipeline and compare it with one rank;
# plan a layout, dry-run it under mpirun with 8 ranks, change a value with --set and see it in the
# [cfg] log, and watch a bad layout get refused.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
launch/setup.sh
bazel build //:bigmac
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun=(mpirun --oversubscribe --bind-to none --mca btl self,vader --mca btl_vader_single_copy_mechanism none)
step() { printf '\n=== %s (at %d s)\n$ %s\n' "$1" "$SECONDS" "${*:2}"; }

step "prepare the fortunes corpus (Debian package 'fortunes') as byte-level token shards" \
  bazel-bin/bigmac data prep --input /usr/share/games/fortunes/... --output data/fortunes
corpus=$(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.*' | sort)
bazel-bin/bigmac data prep --input $corpus --output data/fortunes --overwrite

step "train configs/tiny.yaml on one rank (a few minutes on 2 cores), with a text sample every 200 steps" \
  bazel-bin/bigmac train --config configs/tiny.yaml --set train.sample_interval=200 --set checkpoint.dir=data/ckpt_tiny
rm -rf data/ckpt_tiny
bazel-bin/bigmac train --config configs/tiny.yaml --set train.sample_interval=200 \
  --set checkpoint.dir=data/ckpt_tiny "$@" | grep -v '^\[cfg\]   ' | tee data/demo_fp32.log

step "TensorBoard: the run's events file, read back with TensorBoard's own reader (tensorboard --logdir runs)" \
  python3 tests/tensorboard_read.py runs/latest
python3 tests/tensorboard_read.py runs/latest | python3 -c '
import json, sys
d = json.load(sys.stdin)
print("  runs/latest/" + d["files"][0])
for tag, points in sorted(d["scalars"].items()):
    print("  %-24s %4d points, last %.5g at step %d" % (tag, len(points), points[-1][1], points[-1][0]))
print("  text summaries: " + ", ".join(sorted(d["text"])))'

step "generate: text from the checkpoint the run saved (any layout loads on one rank)" \
  bazel-bin/bigmac generate --checkpoint data/ckpt_tiny --prompt "The " --tokens 200 --seed 7
bazel-bin/bigmac generate --checkpoint data/ckpt_tiny --prompt "The " --tokens 200 --seed 7

# Shorter repeated runs: 150 steps each (the learning-rate schedule follows train.max_steps, so the
# fp32 baseline is run at 150 steps too).
short=(--set train.max_steps=150 --set train.eval_interval=150 --set train.log_interval=50)
step "the same GPT for 150 steps in fp32 and in bf16: fp32 masters, bf16 compute copies and activations (CPU numerics)" \
  bazel-bin/bigmac train --config configs/tiny.yaml --set precision.dtype=bf16 --set train.max_steps=150
for p in fp32 bf16; do
  bazel-bin/bigmac train --config configs/tiny.yaml --set precision.dtype=$p "${short[@]}" "$@" |
    grep -E '^(step 150/|\[val\] step 150 |\[train\] precision)' >"data/demo_short_$p.log"
done
echo "losses at step 150:"
for p in fp32 bf16; do
  printf '  %s: %s | %s\n' "$p" "$(grep '^step 150/' "data/demo_short_$p.log" | cut -d'|' -f1-2)" \
    "$(grep '^\[val\]' "data/demo_short_$p.log" | cut -d'|' -f2)"
done

step "llama: configs/llama_tiny.yaml (RMSNorm, RoPE, 4 query heads over 2 key/value heads, SwiGLU, untied head), GPT tiny's size, the same 150 steps" \
  bazel-bin/bigmac train --config configs/llama_tiny.yaml --set train.max_steps=150 --set checkpoint.dir=data/ckpt_llama
rm -rf data/ckpt_llama
bazel-bin/bigmac train --config configs/llama_tiny.yaml "${short[@]}" --set checkpoint.dir=data/ckpt_llama "$@" |
  grep -E '^(\[train\] model|step 150/|\[val\] step 150 )' | tee data/demo_short_llama.log
bazel-bin/bigmac generate --checkpoint data/ckpt_llama --prompt "The " --tokens 120 --seed 7
echo "validation loss at step 150 (nats per byte), same data, steps and learning-rate schedule:"
for run in gpt:fp32:data/demo_fp32.log llama:llama:data/demo_short_llama.log; do
  IFS=: read -r name log model_log <<<"$run"
  printf '  %-6s %s parameters, val_loss %s\n' "$name" \
    "$(grep -o 'model: [0-9]*' "$model_log" | grep -o '[0-9]*')" \
    "$(grep '^\[val\]' "data/demo_short_$log.log" | awk '{print $6}')"
done

step "SentencePiece: a 2048-piece BPE vocabulary trained on the same text, the same model for 150 steps; val loss per token and per byte" \
  bazel-bin/bigmac data prep --input ... --output data/fortunes_sp --tokenizer sentencepiece --vocab-size 2048
bazel-bin/bigmac data prep --input $corpus --output data/fortunes_sp --overwrite \
  --tokenizer sentencepiece --vocab-size 2048
bazel-bin/bigmac train --config configs/tiny.yaml --set data.dir=data/fortunes_sp \
  --set model.vocab_size=2048 "${short[@]}" "$@" | grep -E '^\[val\] step 150 ' >data/demo_short_sp.log
# bits/byte = nats/token / ln 2 * tokens/bytes (docs/data.md); byte-level: one byte per token.
json_field() { grep -o "\"$2\": [0-9]*" "$1" | grep -o '[0-9]*$'; }
for run in fp32:1:1 sp:$(json_field data/fortunes_sp/tokenizer.json val_tokens):$(json_field data/fortunes_sp/tokenizer.json val_bytes); do
  IFS=: read -r name tokens bytes <<<"$run"
  grep '^\[val\]' "data/demo_short_$name.log" | tail -1 | awk -v n="$name" -v t="$tokens" -v b="$bytes" \
    '{printf "  %-13s val_loss %.4f nats/token = %.4f bits/byte\n", (n == "sp" ? "sentencepiece" : "byte-level"), $6, $6 / log(2) * t / b}'
done

step "pipeline schedules, simulated: the grid, the bubble, a Perfetto trace" \
  "bazel-bin/bigmac schedule --kind {1f1b,zb_h1} --pp 4 --microbatches 8"
for kind in 1f1b zb_h1; do
  bazel-bin/bigmac schedule --kind "$kind" --pp 4 --microbatches 8 --trace "data/schedule_$kind.json" --overwrite
done

step "pipeline training: 4 ranks (1F1B, [7,7,7,6] layers) against 1 rank on the same global batch" \
  mpirun -np 4 bazel-bin/bigmac train --config configs/tiny_pp4.yaml --set train.max_steps=20
"${mpirun[@]}" -np 4 bazel-bin/bigmac train --config configs/tiny_pp4.yaml --set train.max_steps=20 \
  --dump data/demo_pp4 --overwrite | grep -E '^(step|\[val\]|\[memory\])'
bazel-bin/bigmac train --config configs/tiny_pp4.yaml --set train.max_steps=20 --set parallel.pp_size=1 \
  --dump data/demo_pp1 --overwrite | grep -E '^step 20'
echo "per-step loss, 4 ranks vs 1 rank:"
paste data/demo_pp4/losses.txt data/demo_pp1/losses.txt | awk '{printf "  step %2d  %.10f  %.10f  %s\n", NR, $1, $2, ($1 == $2 ? "identical" : "DIFFERENT")}'

step "checkpoints: save at step 10 on 4 ranks, resume on 2 ranks, compare with the uninterrupted run" \
  mpirun -np 2 bazel-bin/bigmac train --config configs/tiny_pp4.yaml --set parallel.pp_size=2 --resume data/ckpt/step_000010
rm -rf data/ckpt data/ckpt_resumed data/demo_resumed
"${mpirun[@]}" -np 4 bazel-bin/bigmac train --config configs/tiny_pp4.yaml --set train.max_steps=20 \
  --set checkpoint.dir=data/ckpt --set checkpoint.interval=10 | grep '^\[ckpt\]'
bazel-bin/bigmac ckpt inspect data/ckpt/step_000010 | sed -n '1,3p;$p'
"${mpirun[@]}" -np 2 bazel-bin/bigmac train --config configs/tiny_pp4.yaml --set train.max_steps=20 \
  --set parallel.pp_size=2 --set checkpoint.dir=data/ckpt_resumed --resume data/ckpt/step_000010 \
  --dump data/demo_resumed --overwrite | grep '^\[ckpt\] resumed'
echo "steps 11-20, uninterrupted on 4 ranks vs resumed on 2 ranks:"
paste <(tail -n 10 data/demo_pp4/losses.txt) data/demo_resumed/losses.txt |
  awk '{printf "  step %2d  %.10f  %.10f  %s\n", NR + 10, $1, $2, ($1 == $2 ? "identical" : "DIFFERENT")}'

step "tensor parallelism: tp=2 x pp=2 on 4 ranks against the 4-stage tp=1 run above" \
  mpirun -np 4 bazel-bin/bigmac train --config configs/tiny_pp4.yaml --set parallel.tp_size=2 --set parallel.pp_size=2
"${mpirun[@]}" -np 4 bazel-bin/bigmac train --config configs/tiny_pp4.yaml --set train.max_steps=20 \
  --set parallel.tp_size=2 --set parallel.pp_size=2 --dump data/demo_tp2 --overwrite |
  grep -E '^(\[cfg\] (tp groups|vocab)|\[rank\]|step 20)'
echo "per-step loss, tp=2 pp=2 vs tp=1 pp=4 (docs/tensor_parallel.md: within 1e-5 relative):"
paste data/demo_tp2/losses.txt data/demo_pp4/losses.txt | awk '{d = ($1 - $2) / $2; if (d < 0) d = -d;
  printf "  step %2d  %.10f  %.10f  %s\n", NR, $1, $2, ($1 == $2 ? "identical" : (d <= 1e-5 ? sprintf("within %.1e", d) : "DIFFERENT"))}'

step "planning: the stage table of every policy, the largest micro-batch, a fair comparison" \
  "bazel-bin/bigmac plan | tune-mbs | compare"
bazel-bin/bigmac plan --config configs/tiny_pp4.yaml --world-size 4 | grep '^\[plan\]' | sed -n '1,12p'  # sed reads to the end: no SIGPIPE under pipefail
bazel-bin/bigmac plan --config configs/tiny_pp4.yaml --world-size 4 | grep '^\[plan\] recommend'
bazel-bin/bigmac tune-mbs --config configs/tiny.yaml --set device.memory_limit=64MiB --hi 64 --steps 2
bazel-bin/bigmac compare --baseline configs/tiny_pp4.yaml --candidate configs/tiny_pp4.yaml \
  --set-candidate model.partition=last --steps 12 --warmup 2 --out data/compare --overwrite \
  --launcher "${mpirun[*]} -np {np}" | sed -n '/^metric/,$p'

step "plan: the stage table for 8 ranks, no MPI needed" bazel-bin/bigmac plan --config configs/tiny_pp4.yaml --world-size 8
bazel-bin/bigmac plan --config configs/tiny_pp4.yaml --world-size 8 | grep -v '^\[cfg\]   [a-z]*\.' | grep -v '^\[plan\]'

step "dry-run under mpirun: rank 0 prints the effective config, every rank its coordinates" \
  mpirun -np 8 bazel-bin/bigmac train --config configs/tiny_pp4.yaml --dry-run
"${mpirun[@]}" -np 8 bazel-bin/bigmac train --config configs/tiny_pp4.yaml --dry-run | grep -v '^\[cfg\]   [a-z]*\.'

step "an override shows up in the log with its source" \
  mpirun -np 8 bazel-bin/bigmac train --config configs/tiny_pp4.yaml --dry-run --set model.partition=spread_last
"${mpirun[@]}" -np 8 bazel-bin/bigmac train --config configs/tiny_pp4.yaml --dry-run \
  --set model.partition=spread_last | grep -E '^\[cfg\] (split_points|stage)|model.partition ='

step "a layout that cannot work stops every rank with exit code 2" \
  mpirun -np 8 bazel-bin/bigmac train --config configs/tiny_pp4.yaml --dry-run --set parallel.pp_size=3
set +e
"${mpirun[@]}" -np 8 bazel-bin/bigmac train --config configs/tiny_pp4.yaml --dry-run \
  --set parallel.pp_size=3 2>&1 | grep '^bigmac\|^  -'
echo "exit code: ${PIPESTATUS[0]}"
