#!/usr/bin/env bash
# Line coverage (gcov) of BigMac's GPU code under the emulated tests: stages/cuda/,
# core/device/cuda/ (not its emulation/), stages/gpt/cuda/ and core/comm/nccl/, built with
# --coverage -O0 and run by every test named *emulated* (the cuda_*_test twins and the
# emulated_*_test suites). Prints a table per file, the lines of __global__ kernels apart, and
# the uncovered line ranges with --verbose. Builds in its own Bazel output base, so the regular
# cache stays. About 15 minutes on 2 cores from cold.
#
#   launch/coverage.sh [--verbose]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
verbose=${1:-}
base=${BIGMAC_COVERAGE_OUTPUT_BASE:-$HOME/.cache/bigmac-coverage}
bz=(bazel --output_base="$base")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=passive
scope='(stages/cuda|core/device/cuda|stages/gpt/cuda|core/comm/nccl)/[^/]*\.(cc|cu)$'
# Compiles run unsandboxed so that gcc's .gcno notes stay next to the objects (they are no
# declared output), and tests too, so that their .gcda counts stay; the extra define keys those
# compiles apart from ones that left no notes.
flags=(--symlink_prefix=/ --strategy=CppCompile=local --strategy=TestRunner=local
  "--per_file_copt=.*($scope|_emulated_.*\.cc$)@--coverage,-O0,-DBIGMAC_GCOV_NOTES"
  --linkopt=--coverage --test_output=errors)
mapfile -t tests < <("${bz[@]}" query 'attr(name, "emulated", tests(//tests/...))' 2>/dev/null)
execroot=$("${bz[@]}" info "${flags[@]}" execution_root 2>/dev/null)
bin=$("${bz[@]}" info "${flags[@]}" bazel-bin 2>/dev/null)
find "$bin" -name '*.gcda' -delete 2>/dev/null || true
# A failing test still leaves its coverage: report it, and exit non-zero at the end.
status=0
"${bz[@]}" test "${flags[@]}" --nocache_test_results "${tests[@]}" >"$base.log" 2>&1 || status=$?
grep -E "^//tests:" "$base.log" || tail -20 "$base.log"

python3 - "$execroot" "$bin" "$scope" "$verbose" <<'PY'
import json, os, re, shutil, subprocess, sys, tempfile
execroot, bin_dir, scope, verbose = sys.argv[1:5]
scope = re.compile(scope)
hits = {}      # file -> {line: count}
kernels = {}   # file -> set of lines inside __global__ functions
work = tempfile.mkdtemp()
# Each test writes its .gcda counts under its runfiles tree (the objects' relative paths), while
# gcc left the .gcno notes beside the objects: pair them in a scratch directory, one at a time.
for root, _, names in os.walk(bin_dir):
    for name in names:
        if not name.endswith(".gcda"):
            continue
        gcda = os.path.join(root, name)
        rel = gcda.split(".runfiles/bigmac/", 1)[-1] if ".runfiles/bigmac/" in gcda else \
            os.path.relpath(gcda, execroot)
        gcno = os.path.join(execroot, rel[:-len(".gcda")] + ".gcno")
        if not os.path.exists(gcno):
            continue
        for stale in os.listdir(work):
            os.remove(os.path.join(work, stale))
        shutil.copy(gcda, os.path.join(work, "object.gcda"))
        shutil.copy(gcno, os.path.join(work, "object.gcno"))
        out = subprocess.run(["gcov", "-j", "-t", "-o", work, os.path.join(work, "object.gcda")],
                             cwd=execroot, capture_output=True, text=True).stdout
        for text_line in out.splitlines():
            if not text_line.startswith("{"):
                continue
            report = json.loads(text_line)
            for entry in report["files"]:
                path = os.path.normpath(entry["file"])
                if os.path.isabs(path):
                    path = os.path.relpath(path, execroot)
                if not scope.search(path) or "/emulation/" in path or not os.path.exists(path):
                    continue
                lines = hits.setdefault(path, {})
                for line in entry["lines"]:
                    lines[line["line_number"]] = lines.get(line["line_number"], 0) + line["count"]
                text = open(path).read().split("\n")
                for fn in entry.get("functions", []):
                    head = " ".join(text[max(0, fn["start_line"] - 3):fn["start_line"]])
                    if "__global__" in head:
                        kernels.setdefault(path, set()).update(
                            range(fn["start_line"], fn["end_line"] + 1))

def ranges(numbers):
    out, numbers = [], sorted(numbers)
    for n in numbers:
        if out and n == out[-1][1] + 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in out)

total = covered = k_total = k_covered = 0
print(f"{'file':44s} {'lines':>6s} {'covered':>8s} {'kernel lines':>13s} {'covered':>8s}")
for path in sorted(hits):
    lines = hits[path]
    klines = {n: c for n, c in lines.items() if n in kernels.get(path, set())}
    t, c = len(lines), sum(1 for v in lines.values() if v > 0)
    kt, kc = len(klines), sum(1 for v in klines.values() if v > 0)
    total, covered, k_total, k_covered = total + t, covered + c, k_total + kt, k_covered + kc
    kernel = f"{kt:13d} {100.0 * kc / kt:7.1f}%" if kt else f"{'':13s} {'':8s}"
    print(f"{path:44s} {t:6d} {100.0 * c / t:7.1f}% {kernel}")
    if verbose:
        missed = [n for n, v in lines.items() if v == 0]
        if missed:
            print(f"    not run: {ranges(missed)}")
print(f"{'all':44s} {total:6d} {100.0 * covered / max(total, 1):7.1f}% "
      f"{k_total:13d} {100.0 * k_covered / max(k_total, 1):7.1f}%")
PY
exit $status
