#!/usr/bin/env bash
# Soak run: thousands of steps of the tiny pp=4 config under mpirun (4 CPU ranks), checking that
# nothing grows per step: each rank's process RSS (from /proc, in metrics.jsonl) and allocator
# peak, early against late. Not a test (minutes); the numbers go in the issue notes.
# Usage: bench/soak.sh [STEPS, default 3000] [extra bigmac train args...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
launch/setup.sh
bazel build //:bigmac >/dev/null 2>&1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=passive
steps=${1:-3000}
shift || true
if [[ ! -d data/fortunes ]]; then
  bazel-bin/bigmac data prep --input $(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.*' | sort) \
    --output data/fortunes >/dev/null
fi
out=${SOAK_DIR:-/tmp/bigmac_soak}
rm -rf "$out" && mkdir -p "$out"
start=$SECONDS
mpirun -np 4 --oversubscribe --bind-to none bazel-bin/bigmac train --config configs/tiny_pp4.yaml \
  --set train.max_steps="$steps" --set train.log_interval=500 --set train.eval_interval=1000 \
  --set train.output_dir="$out/run" --set checkpoint.dir="$out/ckpt" --set checkpoint.interval=1000 \
  "$@" | grep -vE '^\[cfg\]' | tee "$out/train.log"
echo "soak: $steps steps in $((SECONDS - start)) s"
python3 - "$out/run/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
n = len(rows)
early = rows[min(9, n - 1)]          # after the first steps' one-time allocations
late = rows[-1]
print(f"soak: {n} steps recorded; per rank, step {early['step']} -> step {late['step']}:")
worst = 0.0
for a, b in zip(early["ranks"], late["ranks"]):
    rss_a, rss_b = a["rss_bytes"] / 2**20, b["rss_bytes"] / 2**20
    peak_a, peak_b = a["peak_bytes"] / 2**20, b["peak_bytes"] / 2**20
    per_k = (rss_b - rss_a) / max(1, late["step"] - early["step"]) * 1000
    worst = max(worst, per_k)
    print(f"  rank {a['rank']}: RSS {rss_a:.1f} -> {rss_b:.1f} MiB ({per_k:+.3f} MiB per 1000 steps),"
          f" allocator peak {peak_a:.2f} -> {peak_b:.2f} MiB")
# Peak of RSS over the whole run: a leak shows as a steady climb, not just a late value.
for r in range(len(rows[0]["ranks"])):
    series = [row["ranks"][r]["rss_bytes"] / 2**20 for row in rows[min(9, n - 1):]]
    print(f"  rank {r}: RSS min {min(series):.1f}, max {max(series):.1f} MiB after step 10")
print(f"soak: worst RSS growth {worst:+.3f} MiB per 1000 steps")
PY
