#!/usr/bin/env bash
# Fuzzes every reader of untrusted files with libFuzzer (clang, ASan, UBSan): the config loader,
# the checkpoint manifest and files, the token shards, safetensors. Usage:
#   launch/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     (default 60 s each, all five targets)
# Builds in its own Bazel output base (clang) so the regular gcc cache is untouched. Starts from
# the committed seeds (tests/fuzz/corpus/<target>/), grows a working corpus under $OUT_DIR, and
# prints one line per target: executions, executions per second, crashes. A crash leaves its
# input as $OUT_DIR/<target>/crash-* (add it to the seeds once fixed: the replay tests keep it).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
launch/setup.sh --fuzz || exit 1

seconds=${1:-60}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(config manifest checkpoint shard safetensors)
output_base=${BIGMAC_FUZZ_OUTPUT_BASE:-$HOME/.cache/bigmac-fuzz}
out_dir=${OUT_DIR:-fuzz_out}

labels=()
for target in "${targets[@]}"; do labels+=("//tests/fuzz:${target}_fuzzer"); done
bazel --output_base="$output_base" build --config=fuzz --symlink_prefix=/ --repo_env=CC=clang \
  --repo_env=CXX=clang++ "${labels[@]}" || exit 1
bin=$(bazel --output_base="$output_base" info --config=fuzz --repo_env=CC=clang bazel-bin)

mkdir -p "$out_dir"
failed=0
summary=()
for target in "${targets[@]}"; do
  work=$out_dir/$target
  rm -rf "$work"
  mkdir -p "$work/corpus"
  cp tests/fuzz/corpus/"$target"/* "$work/corpus/"
  log=$work/fuzz.log
  echo "fuzz: $target for $seconds s"
  BIGMAC_FUZZ_DATA=tests/fuzz TMPDIR=$(mktemp -d) \
    "$bin/tests/fuzz/${target}_fuzzer" -max_total_time="$seconds" -rss_limit_mb=2048 \
    -timeout=10 -print_final_stats=1 -artifact_prefix="$work/" "$work/corpus" >"$log" 2>&1
  status=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  crashes=$(find "$work" -maxdepth 1 -name 'crash-*' -o -maxdepth 1 -name 'leak-*' \
    -o -maxdepth 1 -name 'timeout-*' -o -maxdepth 1 -name 'oom-*' | wc -l)
  corpus=$(find "$work/corpus" -type f | wc -l)
  if ((status != 0 || crashes > 0)); then
    failed=1
    tail -40 "$log"
  fi
  summary+=("$(printf '%-12s %10s execs %8s/s %3d crashes %5d corpus files (exit %d)' \
    "$target" "${runs:-?}" "${speed:-?}" "$crashes" "$corpus" "$status")")
done
printf '%s\n' "${summary[@]}"
exit "$failed"
