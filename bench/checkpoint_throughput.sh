#!/usr/bin/env bash
# Checkpoint save and load MB/s on the 124M GPT-2 shape against `dd` on the same disk, and the
# step-time cost of asynchronous and synchronous saves (bench/checkpoint_bench.py, issue 31).
# Usage: bench/checkpoint_throughput.sh [bench/checkpoint_bench.py arguments]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
launch/setup.sh
bazel build //:bigmac >/dev/null 2>&1
if [[ ! -d data/fortunes ]]; then
  bazel-bin/bigmac data prep --input $(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.*' | sort) \
    --output data/fortunes >/dev/null
fi
exec python3 bench/checkpoint_bench.py "$@"
