#!/usr/bin/env bash
# The GPU machine's check, in one go and under 8 minutes (docs/gpu.md): run from an unpacked
# bundle (launch/bundle.sh), it prints what it found (GPU, driver, glibc, which CUDA libraries it
# loads from where), runs every GPU test binary, a 2-rank transport ping-pong (NCCL where there
# are two GPUs; MPI staged through pinned host memory with both ranks on one GPU), compares
# tiny-model losses GPU vs CPU (fp32 and bf16; GPT and llama), trains pp=2 as two ranks on the one GPU against
# pp=1, measures GPT-2 124M (tokens/s, step time, peak memory, MFU against the GEMM peak measured
# here and against 989 TFLOP/s), and runs the tiny model under CUDA_LAUNCH_BLOCKING=1 and
# compute-sanitizer. Every step has a timeout; a failed step does not stop the others. The last
# lines are a table (check | result | numbers); the exit code is 1 if any check failed.
#
#   mkdir -p /tmp/b && tar xzf out/bigmac-bundle.tar.gz -C /tmp/b && /tmp/b/launch/device_check.sh "$OUT"
#
# OUTDIR receives device_check.log (this output), summary.txt (the table) and logs.tar.gz (every
# step's log, the gtest XML, metrics.jsonl of each run, ldd and nvidia-smi output): few files, as
# the device tool returns at most 8.
#
# Environment (defaults for the GPU machine):
#   BIGMAC_DEVICE_CHECK_BACKEND=cuda   the backend of the "GPU" runs; cpu for a smoke run on a
#                                      machine without a GPU (GPU tests may then skip, sizes shrink)
#   BIGMAC_DEVICE_CHECK_STEPS=20       steps of each tiny run
#   BIGMAC_DEVICE_CHECK_BUDGET_S=450   the whole script's time budget; later steps get what is left
#   BIGMAC_DEVICE_CHECK_GPT2_MBS=16    GPT-2 124M micro-batch (seq 1024, bf16)
set -euo pipefail

(($# == 1)) || { echo "usage: device_check.sh OUTDIR" >&2; exit 2; }
started=$SECONDS
budget=${BIGMAC_DEVICE_CHECK_BUDGET_S:-450}
backend=${BIGMAC_DEVICE_CHECK_BACKEND:-cuda}
steps=${BIGMAC_DEVICE_CHECK_STEPS:-20}
gpt2_mbs=${BIGMAC_DEVICE_CHECK_GPT2_MBS:-16}
gpt2_steps=20
gpt2_warmup=5
peak_datasheet=989 # TFLOP/s, dense bf16, H100/H200 SXM datasheet
# Tolerances on the per-step loss, max over steps of |a - b| / |b|.
tol_fp32=1e-3 # GPU fp32 vs CPU fp32
tol_bf16=3e-2 # GPU bf16 vs CPU bf16 (same numerics: bf16 storage, fp32 arithmetic)
tol_pp=1e-4   # GPU pp=2 vs GPU pp=1, fp32 (on the CPU this is bitwise)

outdir=$1
mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd)
logs=$outdir/logs
rm -rf "$logs"
mkdir -p "$logs"
console=$outdir/device_check.log
: >"$console"
say() { printf '%s\n' "$*" | tee -a "$console"; }

# ---- the bundle --------------------------------------------------------------------------------
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bundle=$here
if [[ ! -x "$bundle/libexec/bigmac" ]]; then
  # Run from the repository: unpack the bundle found at the usual place.
  tarball=${BIGMAC_BUNDLE_TARBALL:-$here/out/bigmac-bundle.tar.gz}
  [[ -f "$tarball" ]] || { say "device_check: no bundle here and no $tarball (launch/bundle.sh)"; exit 2; }
  bundle=${TMPDIR:-/tmp}/bigmac-bundle
  rm -rf "$bundle" && mkdir -p "$bundle" && tar xzf "$tarball" -C "$bundle"
fi
bundle=$(cd "$bundle" && pwd -P)
original_ld_library_path=${LD_LIBRARY_PATH:-}
export BIGMAC_BUNDLE=$bundle
# shellcheck source=launch/bundle/env.sh
source "$bundle/bin/env.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=passive
cd "$logs"

# ---- results ----------------------------------------------------------------------------------
names=()
results=()
numbers=()
failed=0
record() { # record CHECK PASS|FAIL|SKIP NUMBERS
  names+=("$1")
  results+=("$2")
  numbers+=("$3")
  [[ "$2" == FAIL ]] && failed=$((failed + 1))
  say "[check] $1: $2${3:+ ($3)}"
}
left() { echo $((budget - (SECONDS - started))); }
# run_step NAME TIMEOUT COMMAND...: output into logs/NAME.log; sets rc (124 = timed out) and secs.
rc=0
secs=0
run_step() {
  local name=$1 limit=$2 remaining
  shift 2
  remaining=$(($(left) - 5))
  ((limit > remaining)) && limit=$remaining
  if ((limit < 5)); then
    rc=125
    secs=0
    say "[step] $name: not run, the time budget (${budget} s) is used up"
    echo "not run: time budget used up" >"$name.log"
    return 0
  fi
  say "[step] $name (timeout ${limit} s): $*"
  local t0=$SECONDS
  rc=0
  timeout -k 10 "$limit" "$@" >"$name.log" 2>&1 || rc=$?
  secs=$((SECONDS - t0))
  if ((rc != 0)); then
    say "[step] $name: $(why "$rc") after ${secs} s; the end of logs/$name.log:"
    tail -n 8 "$name.log" | sed 's/^/    /' | tee -a "$console"
  fi
  return 0
}
why() { # why RC: a short reason for a failed step
  case $1 in
    0) echo "ok" ;;
    124 | 137) echo "timed out" ;;
    125) echo "not run (time budget)" ;;
    *) echo "exit $1" ;;
  esac
}
# why RC plus the first error line of logs/NAME.log
reason() {
  local line
  # The first error line, and the next one too when it ends in ':' (bigmac lists its problems).
  line=$(awk 'hit { sub(/^ +/, ""); printf " %s", $0; exit }
    /^bigmac:|rror|FAIL|out of memory|not found|Abort|Segmentation/ { printf "%s", $0; if ($0 !~ /:$/) exit; hit = 1 }' \
    "$1.log" 2>/dev/null | cut -c1-240 || true)
  echo "$(why "$2")${line:+: $line}"
}
# First value of "key": in a JSON line (top-level keys come before the per-rank array).
jget() {
  awk -v key="\"$2\":" '{ i = index($0, key); if (i) { s = substr($0, i + length(key)); sub(/[,}].*/, "", s); print s } }' \
    "$1" 2>/dev/null || true
}

# ---- 1. the machine ----------------------------------------------------------------------------
say "device_check: bundle $bundle ($(sed -n 's/^revision=//p' "$bundle/MANIFEST.txt")), backend $backend, $steps steps, budget ${budget} s"
gpu_found=0
if command -v nvidia-smi >/dev/null; then
  run_step nvidia_smi 30 nvidia-smi
  tee -a "$console" <nvidia_smi.log
  timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader \
    >gpu.txt 2>&1 || true
  gpu=$(head -1 gpu.txt)
  cuda_driver=$(sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' nvidia_smi.log | head -1 || true)
  [[ $rc == 0 && -n "$gpu" ]] && gpu_found=1
else
  gpu="no nvidia-smi"
  cuda_driver=""
fi
glibc_here=$(getconf GNU_LIBC_VERSION | awk '{ print $2 }')
glibc_needed=$(sed -n 's/^glibc_required=//p' "$bundle/MANIFEST.txt")
glibc_ok=0
[[ "$(printf '%s\n%s\n' "$glibc_needed" "$glibc_here" | sort -V | head -1)" == "$glibc_needed" ]] && glibc_ok=1
os=$( (. /etc/os-release && echo "$PRETTY_NAME") 2>/dev/null || uname -sr)
machine="$gpu; CUDA driver API ${cuda_driver:-?}; $os; glibc $glibc_here (bundle needs $glibc_needed)"
if [[ "$backend" == cuda ]] && ((gpu_found == 0)); then
  record machine FAIL "$machine"
elif ((glibc_ok == 0)); then
  record machine FAIL "$machine"
else
  record machine PASS "$machine"
fi

# The CUDA libraries: the machine's Python wheels first, then /usr/local/cuda.
python=$(command -v python3 || true)
[[ -x /opt/torch/.venv/bin/python3 ]] && python=/opt/torch/.venv/bin/python3
candidates=()
for dir in /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib; do
  [[ -d "$dir" ]] && candidates+=("$dir")
done
if [[ -n "$python" ]]; then
  while IFS= read -r dir; do
    [[ -d "$dir" ]] && candidates+=("$dir")
  done < <(LD_LIBRARY_PATH=$original_ld_library_path timeout 30 "$python" -c '
import os
try:
    import nvidia
    for root in nvidia.__path__:
        for name in sorted(os.listdir(root)):
            print(os.path.join(root, name, "lib"))
except Exception:
    pass' 2>/dev/null || true)
fi
candidates+=(/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib)
cuda_dirs=""
library_report=""
libs_missing=0
for soname in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2 libnvrtc.so.13; do
  found=""
  for dir in "${candidates[@]}"; do
    if [[ -e "$dir/$soname" ]]; then found=$dir; break; fi
  done
  if [[ -z "$found" ]]; then
    library_report+="$soname=MISSING "
    libs_missing=$((libs_missing + 1))
    continue
  fi
  library_report+="$soname=$(readlink -f "$found/$soname") "
  case ":$cuda_dirs:" in *":$found:"*) ;; *) cuda_dirs=${cuda_dirs:+$cuda_dirs:}$found ;; esac
done
# The driver's libcuda.so.1 (cudart loads it): the loader cache, or a directory of the machine's
# LD_LIBRARY_PATH, or the driver mount.
driver=$(ldconfig -p 2>/dev/null | awk '$1 == "libcuda.so.1" { print $NF; exit }' || true)
if [[ -z "$driver" ]]; then
  IFS=: read -ra driver_dirs <<<"$original_ld_library_path"
  for dir in "${driver_dirs[@]}" /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu /usr/lib64; do
    if [[ -n "$dir" && -e "$dir/libcuda.so.1" ]]; then driver=$dir/libcuda.so.1; break; fi
  done
fi
if [[ -n "$driver" ]]; then
  library_report="libcuda.so.1=$(readlink -f "$driver") $library_report"
else
  library_report="libcuda.so.1=MISSING $library_report"
  [[ "$backend" == cuda ]] && libs_missing=$((libs_missing + 1))
fi
say "device_check: CUDA libraries: $library_report"
if [[ -n "$python" ]]; then
  LD_LIBRARY_PATH=$original_ld_library_path timeout 30 "$python" -c '
import importlib.metadata as m
def version(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return "-"
names = ["torch", "nvidia-cublas", "nvidia-cudnn-cu13", "nvidia-nccl-cu13", "nvidia-cuda-nvrtc", "nvidia-cuda-runtime"]
print("device_check: wheels:", ", ".join(n + " " + version(n) for n in names))' 2>&1 | tee -a "$console" || true
fi
# The bundle's programs: bundle libraries first, then the CUDA libraries found, then what the
# machine had (the driver's libcuda may be there).
# Only the bundle's programs get it (bx): the machine's own tools keep their libraries.
bundle_ld=$bundle/lib${cuda_dirs:+:$cuda_dirs}${original_ld_library_path:+:$original_ld_library_path}
bx=(env "LD_LIBRARY_PATH=$bundle_ld")
say "device_check: the bundle's programs run with LD_LIBRARY_PATH=$bundle_ld"
"${bx[@]}" ldd "$bundle/libexec/bigmac" >ldd_bigmac.txt 2>&1 || true
for test_binary in "$bundle"/tests/*; do
  if [[ -f "$test_binary" ]]; then "${bx[@]}" ldd "$test_binary" >"ldd_${test_binary##*/}.txt" 2>&1 || true; fi
done
run_step bundle_check 60 "$bundle/launch/bundle_check.sh" "$bundle" --list --ld-library-path "$bundle_ld"
cuda_libs=$(sed -n 's/.*CUDA from the machine: *//p' bundle_check.log)
if ((rc == 0 && libs_missing == 0)); then
  record libraries PASS "every library resolves; CUDA linked:${cuda_libs:- none}"
elif ((rc == 0)) && [[ "$backend" != cuda ]]; then
  record libraries PASS "the bundle resolves; CUDA libraries not found: $library_report"
else
  problems="$(reason bundle_check "$rc") $(grep FAIL bundle_check.log | sed -n '2,3p' | tr '\n' ' ' || true)"
  ((libs_missing)) && problems+=" CUDA libraries: $library_report"
  record libraries FAIL "$problems"
fi

# ---- 2. the bf16 GEMM peak ---------------------------------------------------------------------
peak_measured=""
if [[ -x "$bundle/bin/cuda_gemm_peak" ]]; then
  run_step gemm_peak 90 "${bx[@]}" "$bundle/bin/cuda_gemm_peak"
  peak_measured=$(sed -n 's/.*bf16_gemm_tflops=\([0-9.]*\).*/\1/p' gemm_peak.log | tail -1 || true)
  if ((rc == 0)) && [[ -n "$peak_measured" ]]; then
    record gemm_peak PASS "bf16 GEMM ${peak_measured} TFLOP/s"
  else
    record gemm_peak FAIL "$(reason gemm_peak "$rc"); no bf16_gemm_tflops= line"
  fi
else
  record gemm_peak SKIP "no bin/cuda_gemm_peak in this bundle; MFU against ${peak_datasheet} only"
fi

# ---- 3. the GPU tests --------------------------------------------------------------------------
for test_binary in "$bundle"/tests/*; do
  [[ -f "$test_binary" && -x "$test_binary" ]] || continue
  name=$(basename "$test_binary")
  rm -f "$name.xml"
  run_step "$name" 120 "${bx[@]}" "$test_binary" --gtest_output="xml:$logs/$name.xml"
  if [[ ! -f "$name.xml" ]]; then
    record "$name" FAIL "$(reason "$name" "$rc"); no gtest XML"
    continue
  fi
  # gtest XML: one <testcase .../> line per case; <failure> inside a failed one; result="skipped".
  # Lines: "passed failed skipped", the failed cases, the skipped cases.
  mapfile -t counts < <(awk '
    /<testcase / { n++; c = $0; sub(/.*classname="/, "", c); sub(/".*/, "", c)
                   t = $0; sub(/.* name="/, "", t); sub(/".*/, "", t); cur = c "." t
                   if ($0 ~ /result="skipped"/) { s++; sl = sl " " cur } }
    /<failure/ { if (!(cur in f)) { f[cur] = 1; nf++; fl = fl " " cur } }
    END { printf "%d %d %d\n%s\n%s\n", n - nf - s, nf, s, fl, sl }' "$name.xml")
  read -r n_pass n_fail n_skip <<<"${counts[0]}"
  detail="$n_pass passed, $n_fail failed, $n_skip skipped in ${secs} s"
  if [[ -n "${counts[1]:-}" ]]; then detail+="; failed:${counts[1]}"; fi
  if [[ -n "${counts[2]:-}" ]]; then detail+="; skipped:${counts[2]}"; fi
  if ((rc != 0 || n_fail > 0)); then
    record "$name" FAIL "$(why "$rc"); $detail"
  elif ((n_skip > 0)) && [[ "$backend" == cuda ]]; then
    record "$name" FAIL "a GPU test skipped on the GPU machine; $detail"
  else
    record "$name" PASS "$detail"
  fi
done

# ---- 3b. the transport: two ranks, checksums (bin/nccl_pingpong, docs/transport.md) ------------
# NCCL needs a GPU per rank (it refuses two ranks on one GPU): with one GPU its row is a SKIP that
# says so. The staged row puts both ranks on GPU 0, where device.transport=auto must choose MPI
# staged through pinned host memory (the CPU smoke run stages the CPU device's tensors instead).
pingpong_bin=$bundle/bin/nccl_pingpong
mpirun2=(mpirun -np 2 --oversubscribe --bind-to none -x LD_LIBRARY_PATH)
pingpong_row() { # pingpong_row CHECK STEP [TEXT the rank-0 line must hold]
  local verdict line  # not "numbers": record appends to that global
  verdict=$(sed -n 's/^pingpong: \(PASS\|FAIL\|SKIPPED\)/\1/p' "$2.log" | tail -1 || true)
  line=$(sed -n 's/^pingpong: rank 0 //p' "$2.log" | head -1 | cut -c1-400 || true)
  if [[ "$verdict" == PASS* && $rc == 0 && "$line" == *"${3:-}"* ]]; then
    record "$1" PASS "$line"
  elif [[ "$verdict" == SKIPPED* && $rc == 0 ]]; then
    verdict=${verdict#SKIPPED (}
    record "$1" SKIP "${verdict%)}"
  elif [[ "$verdict" == PASS* && $rc == 0 ]]; then
    record "$1" FAIL "expected '$3' in: $line"
  else
    record "$1" FAIL "$(reason "$2" "$rc")${line:+; $line}"
  fi
}
if [[ ! -x "$pingpong_bin" ]]; then
  record "nccl ping-pong 2 ranks" SKIP "no bin/nccl_pingpong in this bundle"
  record "staged ping-pong 2 ranks on 1 GPU" SKIP "no bin/nccl_pingpong in this bundle"
else
  if [[ "$backend" == cuda ]]; then
    run_step pingpong_nccl 60 "${bx[@]}" "${mpirun2[@]}" "$pingpong_bin" --transport nccl --iterations 200
    pingpong_row "nccl ping-pong 2 ranks" pingpong_nccl "transport=nccl"
    run_step pingpong_staged 60 "${bx[@]}" BIGMAC_SHARE_DEVICES=1 CUDA_VISIBLE_DEVICES=0 "${mpirun2[@]}" \
      -x BIGMAC_SHARE_DEVICES -x CUDA_VISIBLE_DEVICES "$pingpong_bin" --transport auto --iterations 200
    pingpong_row "staged ping-pong 2 ranks on 1 GPU" pingpong_staged "transport=mpi-staged (2 ranks share cuda:0)"
  else
    record "nccl ping-pong 2 ranks" SKIP "backend $backend: NCCL moves GPU memory"
    run_step pingpong_staged 60 "${bx[@]}" "${mpirun2[@]}" "$pingpong_bin" --backend cpu --transport mpi \
      --stage-host --iterations 200
    pingpong_row "staged ping-pong 2 ranks on 1 GPU" pingpong_staged "transport=mpi"
  fi
fi

# ---- 4. tiny model: GPU vs CPU, fp32 and bf16 --------------------------------------------------
tiny=(train --config "$bundle/configs/tiny.yaml" --set "data.dir=$bundle/data/tiny"
  --set "train.max_steps=$steps" --set train.log_interval=1 --set train.eval_batches=2)
# train_run NAME TIMEOUT BACKEND DTYPE [extra bigmac args...]; run_env: VAR=VALUE for the run.
# run_model: the model's train arguments (tiny's, or llama tiny's in section 4b).
run_env=()
run_model=("${tiny[@]}")
train_run() {
  local name=$1 limit=$2 run_backend=$3 dtype=$4
  shift 4
  rm -rf "run_$name"
  run_step "$name" "$limit" "${bx[@]}" "${run_env[@]}" bigmac "${run_model[@]}" --set "device.backend=$run_backend" \
    --set "precision.dtype=$dtype" --set "train.output_dir=$logs/run_$name" "$@"
}
losses() { jget "run_$1/metrics.jsonl" loss 2>/dev/null; }
# compare A B TOL: prints "max_rel=X steps=N ok|bad"
compare() {
  paste <(losses "$1") <(losses "$2") | awk -v tol="$3" -v want="$steps" '
    { n++; a = $1 + 0; b = $2 + 0; d = a - b; if (d < 0) d = -d; r = (b != 0) ? d / (b < 0 ? -b : b) : d
      if ($1 !~ /^-?[0-9.e+-]+$/ || $2 !~ /^-?[0-9.e+-]+$/) bad = 1; if (r > m) m = r; if (d != 0) diff = 1 }
    END { ok = (n == want && !bad && m <= tol); printf "max_rel=%.2e steps=%d %s%s\n", m, n, (ok ? "ok" : "bad"), (n && !diff ? " bitwise" : "") }'
}
loss_check() { # loss_check CHECK RUN_A RUN_B TOL RC_A RC_B
  local verdict
  if (($5 != 0 || $6 != 0)); then
    record "$1" FAIL "$2: $(reason "$2" "$5"); $3: $(reason "$3" "$6")"
    return
  fi
  verdict=$(compare "$2" "$3" "$4")
  local last_a last_b
  last_a=$(losses "$2" | tail -1)
  last_b=$(losses "$3" | tail -1)
  if [[ "$verdict" == *" ok"* ]]; then
    record "$1" PASS "${verdict% ok*}${verdict#* ok}, tol $4; final loss $last_a vs $last_b"
  else
    record "$1" FAIL "${verdict% bad*}, tol $4 (want $steps steps); final loss $last_a vs $last_b"
  fi
}
train_run cpu_fp32 90 cpu fp32
rc_cpu_fp32=$rc
train_run gpu_fp32 90 "$backend" fp32
rc_gpu_fp32=$rc
loss_check "tiny fp32 gpu vs cpu" gpu_fp32 cpu_fp32 "$tol_fp32" "$rc_gpu_fp32" "$rc_cpu_fp32"
# The trace's device tracks (CUDA events, docs/gpu.md): the GPU run's trace.json must have them.
if [[ "$backend" == cuda ]]; then
  device_spans=$(grep -o '"cat":"device_compute"' run_gpu_fp32/trace.json 2>/dev/null | wc -l || true)
  if ((rc_gpu_fp32 == 0)) && grep -q 'device: compute stream' run_gpu_fp32/trace.json 2>/dev/null &&
    ((device_spans > 0)); then
    record "trace device tracks" PASS "$device_spans device_compute spans in run_gpu_fp32/trace.json"
  else
    record "trace device tracks" FAIL "no 'device: compute stream' spans in run_gpu_fp32/trace.json"
  fi
fi
train_run cpu_bf16 90 cpu bf16
rc_cpu_bf16=$rc
train_run gpu_bf16 90 "$backend" bf16
rc_gpu_bf16=$rc
loss_check "tiny bf16 gpu vs cpu" gpu_bf16 cpu_bf16 "$tol_bf16" "$rc_gpu_bf16" "$rc_cpu_bf16"

# ---- 4b. llama tiny (RMSNorm, RoPE, grouped-query attention, SwiGLU): GPU vs CPU -----------------
run_model=("${tiny[@]/\/configs\/tiny.yaml//configs/llama_tiny.yaml}")
train_run llama_cpu_fp32 90 cpu fp32
rc_llama_cpu_fp32=$rc
train_run llama_gpu_fp32 90 "$backend" fp32
loss_check "llama tiny fp32 gpu vs cpu" llama_gpu_fp32 llama_cpu_fp32 "$tol_fp32" "$rc" "$rc_llama_cpu_fp32"
train_run llama_cpu_bf16 90 cpu bf16
rc_llama_cpu_bf16=$rc
train_run llama_gpu_bf16 90 "$backend" bf16
loss_check "llama tiny bf16 gpu vs cpu" llama_gpu_bf16 llama_cpu_bf16 "$tol_bf16" "$rc" "$rc_llama_cpu_bf16"
run_model=("${tiny[@]}")

# ---- 5. pp=2: two ranks on the one GPU ---------------------------------------------------------
rm -rf run_gpu_pp2
run_step gpu_pp2 120 "${bx[@]}" BIGMAC_SHARE_DEVICES=1 mpirun -np 2 --oversubscribe --bind-to none \
  -x BIGMAC_SHARE_DEVICES -x LD_LIBRARY_PATH bigmac "${tiny[@]}" --set parallel.pp_size=2 \
  --set "device.backend=$backend" --set precision.dtype=fp32 --set "train.output_dir=$logs/run_gpu_pp2"
rc_pp2=$rc
say "device_check: pp=2 ran with $(grep -o 'transport=[^|]*' gpu_pp2.log | sort -u | paste -sd';' - || true)"
loss_check "tiny pp=2 vs pp=1 gpu fp32" gpu_pp2 gpu_fp32 "$tol_pp" "$rc_pp2" "$rc_gpu_fp32"

# ---- 6. GPT-2 124M: throughput, memory, MFU ----------------------------------------------------
gpt2=(train --config "$bundle/configs/gpt2_124m_pp4.yaml" --set parallel.pp_size=1
  --set parallel.num_microbatches=1 --set train.gradient_accumulation_steps=1
  --set model.partition=spread_first --set 'model.layers_per_stage=[]'
  --set "train.micro_batch_size=$gpt2_mbs" --set precision.dtype=bf16 --set "device.backend=$backend"
  --set "data.dir=$bundle/data/tiny" --set train.log_interval=1 --set train.eval_batches=1
  --set "train.output_dir=$logs/run_gpt2")
if [[ "$backend" != cuda ]]; then
  # Smoke run without a GPU: the same path, a model the CPU trains in seconds.
  gpt2+=(--set model.num_layers=2 --set model.hidden_size=64 --set model.num_heads=2
    --set train.seq_length=64 --set train.micro_batch_size=2)
  gpt2_steps=8
  gpt2_warmup=3
fi
gpt2+=(--set "train.max_steps=$gpt2_steps")
gpt2_name="gpt2 124M bf16 mbs $gpt2_mbs"
[[ "$backend" == cuda ]] || gpt2_name="gpt2 (2-layer smoke, $backend)"
rm -rf run_gpt2
run_step gpt2_124m 200 "${bx[@]}" bigmac "${gpt2[@]}"
if ((rc == 0)) && [[ -f run_gpt2/metrics.jsonl ]]; then
  params=$(sed -n 's/^\[train\] model: \([0-9]*\) parameters.*/\1/p' gpt2_124m.log | head -1 || true)
  cfg_value() { sed -n "s/^\[cfg\]   $1 = \([0-9]*\) .*/\1/p" gpt2_124m.log | head -1 || true; }
  layers=$(cfg_value model.num_layers)
  width=$(cfg_value model.hidden_size)
  seq=$(cfg_value train.seq_length)
  mbs=$(cfg_value train.micro_batch_size)
  # Steps after the warm-up: tokens over time, mean step time, peak memory of the fullest rank.
  summary=$(paste <(jget run_gpt2/metrics.jsonl step) <(jget run_gpt2/metrics.jsonl step_ms) \
    <(jget run_gpt2/metrics.jsonl peak_bytes) <(jget run_gpt2/metrics.jsonl loss) |
    awk -v w="$gpt2_warmup" -v tokens="$((mbs * seq))" -v n="$params" -v l="$layers" -v c="$width" \
      -v t="$seq" -v p1="${peak_measured:-0}" -v p2="$peak_datasheet" '
      { if ($3 > peak) peak = $3; last = $4; if ($4 !~ /^-?[0-9.e+-]+$/) bad = 1 }
      $1 > w { ms += $2; k++ }
      END {
        if (!k) { print "none"; exit }
        step_ms = ms / k; tps = tokens * 1000 / step_ms; fpt = 6 * n + 6 * l * c * t
        achieved = tps * fpt / 1e12
        printf "%.0f tok/s, %.1f ms/step, peak %.2f GiB, %.1f TFLOP/s; MFU %s vs GEMM peak, %.1f%% vs %d; %d timed steps, final loss %s%s\n",
          tps, step_ms, peak / 2^30, achieved, (p1 > 0 ? sprintf("%.1f%%", 100 * achieved / p1) : "n/a"),
          100 * achieved / p2, p2, k, last, (bad ? " NOT FINITE" : "") }')
  if [[ "$summary" == none || "$summary" == *"NOT FINITE"* || -z "$params" ]]; then
    record "$gpt2_name" FAIL "${summary:-no metrics}"
  else
    record "$gpt2_name" PASS "$summary (N=$params, 6N+6LCT with L=$layers C=$width T=$seq)"
  fi
else
  record "$gpt2_name" FAIL "$(reason gpt2_124m "$rc")"
fi

# ---- 7. CUDA_LAUNCH_BLOCKING=1 and compute-sanitizer on the tiny model --------------------------
small=(--set model.hidden_size=64 --set train.seq_length=64 --set train.micro_batch_size=4)
run_env=(CUDA_LAUNCH_BLOCKING=1)
train_run launch_blocking 90 "$backend" bf16 "${small[@]}" --set train.max_steps=5
run_env=()
if ((rc == 0)); then
  record "tiny CUDA_LAUNCH_BLOCKING=1" PASS "5 steps bf16 in ${secs} s, final loss $(losses launch_blocking | tail -1)"
else
  record "tiny CUDA_LAUNCH_BLOCKING=1" FAIL "$(reason launch_blocking "$rc")"
fi

sanitizer=$(command -v compute-sanitizer || true)
[[ -z "$sanitizer" && -x /usr/local/cuda/bin/compute-sanitizer ]] && sanitizer=/usr/local/cuda/bin/compute-sanitizer
if [[ -z "$sanitizer" ]]; then
  record "tiny compute-sanitizer memcheck" SKIP "compute-sanitizer not found"
elif [[ "$backend" != cuda ]]; then
  record "tiny compute-sanitizer memcheck" SKIP "backend $backend: nothing for it to check"
else
  rm -rf run_sanitizer
  # The real binary (not the bin/ launcher script); the bundle's libraries through its RUNPATH, so
  # the sanitizer itself runs with the machine's own libraries and the CUDA directories only.
  run_step sanitizer 180 env "LD_LIBRARY_PATH=${cuda_dirs}${original_ld_library_path:+:$original_ld_library_path}" \
    "$sanitizer" --tool memcheck --error-exitcode 86 --print-limit 20 \
    --target-processes all "$bundle/libexec/bigmac" "${tiny[@]}" "${small[@]}" --set train.max_steps=2 \
    --set train.eval_batches=1 --set "device.backend=$backend" --set precision.dtype=bf16 \
    --set "train.output_dir=$logs/run_sanitizer"
  errors=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' sanitizer.log | tail -1 || true)
  if ((rc == 0)) && [[ "${errors:-}" == 0 ]]; then
    record "tiny compute-sanitizer memcheck" PASS "0 errors, 2 steps bf16 in ${secs} s"
  else
    record "tiny compute-sanitizer memcheck" FAIL "$(why "$rc"), ${errors:-no} error summary; $(grep -m1 -E '^=+ (Invalid|Program hit|Error)' sanitizer.log || true)"
  fi
fi

# ---- the table ---------------------------------------------------------------------------------
cd "$outdir"
if tar -czf logs.tar.gz -C "$outdir" logs; then rm -rf "$logs"; fi
total=$((SECONDS - started))
{
  echo
  echo "device_check: $((${#names[@]} - failed)) of ${#names[@]} checks passed or skipped, $failed failed, ${total} s; logs in $outdir/logs.tar.gz"
  width=5
  for name in "${names[@]}"; do ((${#name} > width)) && width=${#name}; done
  printf "%-${width}s | %-6s | %s\n" check result numbers
  for i in "${!names[@]}"; do
    printf "%-${width}s | %-6s | %s\n" "${names[$i]}" "${results[$i]}" "${numbers[$i]}"
  done
} >"$outdir/summary.txt"
tee -a "$console" <"$outdir/summary.txt"
((failed == 0))
