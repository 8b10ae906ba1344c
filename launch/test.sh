#!/usr/bin/env bash
# The test command: installs what is missing, builds everything, runs every test, and ends with
# `tests: N passed, M failed[, K skipped]` counted from the gtest XML of the cases that ran.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

launch/setup.sh || exit 1
# CI runs as root; Open MPI refuses root without these.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

targets=$(bazel query 'tests(//...)' 2>/dev/null) || { echo "test.sh: bazel query failed" >&2; exit 1; }
bazel test //... "$@"
bazel_status=$?

# bazel-testlogs may hold results of targets that no longer exist: read only the current ones.
python3 launch/count_tests.py bazel-testlogs $targets
count_status=$?
if ((bazel_status != 0 || count_status != 0)); then exit 1; fi
