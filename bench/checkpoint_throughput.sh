#!/usr/bin/env bash
# Checkpoint save and load throughput (MB/s) on the tiny config and on a 124M-parameter GPT-2
# shape, set against `dd` writing and reading the same number of bytes on the same disk.
# Usage: bench/checkpoint_throughput.sh [scratch dir, default /tmp/bigmac_ckpt_bench]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
launch/setup.sh
bazel build //:bigmac >/dev/null 2>&1
scratch=${1:-/tmp/bigmac_ckpt_bench}
rm -rf "$scratch" && mkdir -p "$scratch"
if [[ ! -d data/fortunes ]]; then
  bazel-bin/bigmac data prep --input $(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.*' | sort) \
    --output data/fortunes >/dev/null
fi

measure() {  # name, then --set arguments
  local name=$1; shift
  local dir="$scratch/$name"
  local save load
  save=$(bazel-bin/bigmac train --config configs/tiny.yaml --set train.max_steps=1 --set train.eval_batches=1 \
           --set checkpoint.dir="$dir" "$@" | grep '^\[ckpt\] saved')
  sync && echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true  # a cold cache, as for dd below
  load=$(bazel-bin/bigmac train --config configs/tiny.yaml --set train.max_steps=1 --set train.eval_batches=1 \
           --set checkpoint.dir="$dir" --resume auto "$@" | grep '^\[ckpt\] resumed')
  local bytes_mb
  bytes_mb=$(sed -E 's/.*: ([0-9.]+) MB in.*/\1/' <<<"$save")
  local count=$(( ${bytes_mb%.*} + 1 ))
  sync
  local dd_write dd_read
  dd_write=$(dd if=/dev/zero of="$scratch/dd.bin" bs=1M count="$count" conv=fsync 2>&1 | tail -1)
  sync && echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
  dd_read=$(dd if="$scratch/dd.bin" of=/dev/null bs=1M 2>&1 | tail -1)
  rm -f "$scratch/dd.bin"
  echo "== $name"
  echo "  bigmac save: $save"
  echo "  bigmac load: $load"
  echo "  dd write ($count MiB, fsync): $dd_write"
  echo "  dd read: $dd_read"
}

measure tiny
measure gpt2_124m --set model.num_layers=12 --set model.hidden_size=768 --set model.num_heads=12 \
  --set model.vocab_size=50257 --set train.seq_length=64 --set train.micro_batch_size=1
rm -rf "$scratch"
