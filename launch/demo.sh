#!/usr/bin/env bash
# The demo: build bigmac, plan a layout without MPI, dry-run it under mpirun with 8 ranks on the
# CPU, change a value with --set and see it in the [cfg] log, then watch a bad layout get refused.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
launch/setup.sh
bazel build //:bigmac
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun=(mpirun --oversubscribe --bind-to none --mca btl self,vader --mca btl_vader_single_copy_mechanism none)
step() { printf '\n=== %s\n$ %s\n' "$1" "${*:2}"; }

step "plan: the stage table for 8 ranks, no MPI needed" bazel-bin/bigmac plan --config configs/tiny_pp4.yaml --world-size 8
bazel-bin/bigmac plan --config configs/tiny_pp4.yaml --world-size 8 | grep -v '^\[cfg\]   [a-z]*\.'

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
