#!/usr/bin/env bash
# Installs every Debian package BigMac's build, tests and demo need (and, with --fuzz / --bench,
# what launch/fuzz.sh and the PyTorch benchmarks in bench/ need). Idempotent; silent when nothing is missing. The CUDA toolkit is not a Debian package: it must already be in
# /usr/local/cuda (or $CUDA_HOME); this script only checks for it.
set -euo pipefail

packages=(
  bazel-bootstrap        # Bazel 4.2.3, offline WORKSPACE build
  bazel-rules-java       # rules_java for Bazel's own toolchains (WORKSPACE points at it)
  g++
  openmpi-bin libopenmpi-dev
  protobuf-compiler libprotobuf-dev
  libopenblas-dev libopenblas-openmp-dev   # BigMac links the OpenMP build
  libdnnl-dev            # oneDNN: the float GEMM with BIGMAC_CPU_GEMM=onednn (stages/cpu/gemm.cc)
  fortunes               # the demo's English corpus
  libyaml-cpp-dev
  libcli11-dev
  nlohmann-json3-dev
  zlib1g-dev             # CRC-32 of checkpoint files
  libisal-dev            # Intel ISA-L: CRC-32 of checkpoints, CRC-32C of TensorBoard event files
  libsentencepiece-dev   # bigmac data prep --tokenizer sentencepiece (core/data/sentencepiece_shim.cc)
  libgtest-dev libgmock-dev
  libboost-context-dev   # fibers for the emulated CUDA device (core/device/cuda/emulation)
  python3                # launch/count_tests.py reads the gtest XML
  patchelf               # launch/bundle.sh: RUNPATH $ORIGIN/../lib in the bundle's programs
  iproute2               # launch/two_hosts.sh: `ip netns`, veth pairs (tests/mpi/two_hosts_test)
  slurmctld slurmd slurm-client slurm-wlm-basic-plugins munge   # tests/mpi/slurm_test: a real Slurm
)
# Extras for the commands outside the test command (launch/setup.sh --fuzz --bench).
bench=0
for group in "$@"; do
  case "$group" in
    --fuzz) packages+=(clang libclang-rt-14-dev) ;;  # launch/fuzz.sh: libFuzzer
    --bench) packages+=(python3-venv libblis4-openmp); bench=1 ;;  # bench/: PyTorch from PyPI in a venv (below); BLIS for gemm_libraries
    *) echo "setup: unknown option $group (--fuzz, --bench)" >&2; exit 2 ;;
  esac
done

missing=()
for package in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$package")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq >/dev/null
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cuda_home=${CUDA_HOME:-/usr/local/cuda}
if [[ ! -x "$cuda_home/bin/nvcc" ]]; then
  echo "setup: the CUDA toolkit is missing: no $cuda_home/bin/nvcc (BigMac compiles its CUDA targets on every build)" >&2
  exit 1
fi

# TensorBoard's own event-file reader for tests/mpi/tensorboard_test (PyPI `tensorboard`, pinned), for
# the python3 on PATH; Debian's own Python refuses pip without --break-system-packages.
tensorboard_version=2.21.0
if [[ "$(python3 -c 'import tensorboard; print(tensorboard.__version__)' 2>/dev/null)" != "$tensorboard_version" ]]; then
  echo "setup: installing tensorboard $tensorboard_version (PyPI) for the TensorBoard test"
  pip=(python3 -m pip install --quiet --disable-pip-version-check "tensorboard==$tensorboard_version")
  "${pip[@]}" >/dev/null 2>&1 || "${pip[@]}" --break-system-packages >/dev/null
fi

# The cuDNN frontend (header-only C++ graph API for the fused SDPA) from its PyPI wheel, pinned;
# its include/ is unpacked into third_party/cudnn_frontend/include (ignored by git), which the
# WORKSPACE's @cudnn_frontend repository points at.
cudnn_frontend_version=1.32.0
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
frontend_dir="$repo_root/third_party/cudnn_frontend"
if [[ "$(cat "$frontend_dir/VERSION" 2>/dev/null)" != "$cudnn_frontend_version" ]]; then
  echo "setup: unpacking the cuDNN frontend $cudnn_frontend_version headers (PyPI nvidia-cudnn-frontend)"
  wheel_dir=$(mktemp -d)
  python3 -m pip download --quiet --no-deps --disable-pip-version-check \
    "nvidia-cudnn-frontend==$cudnn_frontend_version" -d "$wheel_dir" >/dev/null
  rm -rf "$frontend_dir/include"
  python3 - "$wheel_dir" "$frontend_dir" <<'PY'
import glob, sys, zipfile
wheel = zipfile.ZipFile(glob.glob(sys.argv[1] + "/*.whl")[0])
wheel.extractall(sys.argv[2], [n for n in wheel.namelist() if n.startswith("include/")])
PY
  rm -rf "$wheel_dir"
  echo "$cudnn_frontend_version" > "$frontend_dir/VERSION"
fi

# The benchmarks' peer: today's PyTorch from PyPI (MKL and oneDNN inside), in a virtual environment
# of the Debian Python, shared by every checkout ($BIGMAC_BENCH_VENV; bench/README.md). Debian's
# python3-torch is years behind (1.13, no fused AdamW, no torch.distributed.pipelining).
if ((bench)); then
  venv=${BIGMAC_BENCH_VENV:-$HOME/.cache/bigmac/bench-venv}
  # 2.5 or later: SDPA's enable_gqa (bench/pytorch_gpt.py --arch llama).
  if ! "$venv/bin/python" -c 'import numpy, torch, sys; v = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]); sys.exit(v < (2, 5))' \
      2>/dev/null; then
    echo "setup: installing PyTorch 2.x and numpy from PyPI into $venv"
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check numpy 'torch>=2.5' >/dev/null
  fi
  # transformers for bench/hf_llama_check.py (LlamaForCausalLM on an exported checkpoint).
  if ! "$venv/bin/python" -c 'import transformers, safetensors' 2>/dev/null; then
    echo "setup: installing transformers and safetensors from PyPI into $venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check transformers safetensors >/dev/null
  fi
  # MKL for bench/gemm_libraries (its libmkl_rt.so.3 lands in $venv/lib).
  if [[ ! -e "$venv/lib/libmkl_rt.so.3" ]]; then
    echo "setup: installing MKL from PyPI into $venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check mkl >/dev/null
  fi
fi
