#!/usr/bin/env bash
# Builds and runs under AddressSanitizer (+ LeakSanitizer) and UndefinedBehaviorSanitizer: the
# unit tests, the fuzz replays, and a short pipeline-parallel training run under mpirun (2 ranks,
# pp=2, a plugin layer, a checkpoint saved and resumed). Usage: launch/sanitize.sh [asan|ubsan]...
# (default both). Each sanitizer builds in its own Bazel output base, so the regular cache stays.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
launch/setup.sh || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=passive

sanitizers=("$@")
((${#sanitizers[@]})) || sanitizers=(asan ubsan)
unit_tests=(//tests:config_test //tests:partition_test //tests:topology_test //tests:memory_test
  //tests:gradcheck_test //tests:training_test //tests:schedule_test //tests:compare_test
  //tests:plugin_test //tests:blocked_gemm_test //tests/fuzz:all)
supp=$PWD/launch/lsan.supp
results=()
status=0
for sanitizer in "${sanitizers[@]}"; do
  base=${BIGMAC_SANITIZE_OUTPUT_BASE:-$HOME/.cache/bigmac-$sanitizer}
  bz=(bazel --output_base="$base")
  echo "sanitize: $sanitizer: unit tests"
  "${bz[@]}" test --config="$sanitizer" --symlink_prefix=/ --test_env=LSAN_OPTIONS=suppressions="$supp" \
    "${unit_tests[@]}" 2>&1 | tail -25
  unit=${PIPESTATUS[0]}
  "${bz[@]}" build --config="$sanitizer" --symlink_prefix=/ //:bigmac //plugins/examples/rms_swiglu:librms_swiglu.so \
    >/dev/null 2>&1 || { echo "sanitize: $sanitizer: build failed"; status=1; continue; }
  bin=$("${bz[@]}" info --config="$sanitizer" bazel-bin 2>/dev/null)
  work=$(mktemp -d)
  text=$work/text.txt
  for i in $(seq 1 2000); do echo "Sanitizers read every byte the trainer touches, line $i."; done >"$text"
  "$bin/bigmac" data prep --input "$text" --output "$work/data" >/dev/null || status=1
  run() {
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:detect_odr_violation=0:fast_unwind_on_malloc=0 \
      LSAN_OPTIONS=suppressions=$supp UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      mpirun -np 2 --oversubscribe --bind-to none --mca btl self,vader \
      -x ASAN_OPTIONS -x LSAN_OPTIONS -x UBSAN_OPTIONS -x OMP_WAIT_POLICY \
      "$bin/bigmac" train --config configs/tiny.yaml --set data.dir="$work/data" \
      --set parallel.pp_size=2 --set parallel.schedule=zb_h1 --set model.num_layers=4 \
      --set model.hidden_size=32 --set model.num_heads=2 --set train.seq_length=16 \
      --set train.micro_batch_size=2 --set train.gradient_accumulation_steps=4 \
      --set train.eval_batches=2 --set train.eval_interval=0 --set train.log_interval=1 \
      --set train.output_dir="$work/run" --set checkpoint.dir="$work/ckpt" \
      --plugin "$bin/plugins/examples/rms_swiglu/librms_swiglu.so" \
      --set 'model.layer_types=["rms_swiglu_block:1-2"]' "$@" 2>&1
  }
  echo "sanitize: $sanitizer: mpirun -np 2 training (4 steps, checkpoint), then resume to 6"
  run --set train.max_steps=4 >"$work/first.log"
  first=$?
  run --set train.max_steps=6 --resume auto >"$work/resumed.log"
  resumed=$?
  reports=$(cat "$work/first.log" "$work/resumed.log" |
    grep -cE "ERROR: (Address|Leak)Sanitizer|runtime error:" || true)
  grep -hE "step [0-9]+/|ERROR: |runtime error:|SUMMARY" "$work/first.log" "$work/resumed.log" | tail -12
  results+=("$sanitizer: unit tests exit $unit; training exit $first, resume exit $resumed; $reports sanitizer reports")
  ((unit == 0 && first == 0 && resumed == 0 && reports == 0)) || status=1
  rm -rf "$work"
done
printf 'sanitize: %s\n' "${results[@]}"
exit "$status"
