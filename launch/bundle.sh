#!/usr/bin/env bash
# Packs BigMac for a machine that has a GPU but no Bazel, no Open MPI and no network (docs/gpu.md):
# the binary, the example plugin, the GPU test binaries, bench's GEMM peak and the transport
# ping-pong (tests/nccl_pingpong; where they exist), Open
# MPI relocated into the bundle (mpirun, orted, its MCA components, PMIx, help files, parameter
# files), every shared library they need except glibc's and the big CUDA libraries
# (launch/bundle/libs.sh), configs/, tiny token shards and launch/device_check.sh. Prints the size.
#
#   launch/bundle.sh [OUT.tar.gz]        build with Bazel, then pack (default out/bigmac-bundle.tar.gz)
#   launch/bundle.sh --assemble OUT.tar.gz --bigmac FILE [--plugin FILE]... [--gpu-test FILE]...
#       [--gemm-peak FILE] [--pingpong FILE] [--corpus TEXT]...
#                                        pack prebuilt files (what //tests:bundle_test does); the
#                                        corpus defaults to the fortunes package
#
# The tarball has no top folder: `mkdir -p /tmp/b && tar xzf OUT -C /tmp/b`.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=launch/bundle/libs.sh
source "$repo/launch/bundle/libs.sh"

max_mib=${BIGMAC_BUNDLE_MAX_MIB:-30}
die() {
  echo "bundle: $*" >&2
  exit 1
}

# ---- the files to pack ------------------------------------------------------------------------
out=""
bigmac=""
plugins=()
gpu_tests=()
gemm_peak=""
pingpong=""
corpus=()

if [[ "${1:-}" == --assemble ]]; then
  (($# >= 2)) || die "--assemble needs OUT.tar.gz"
  out=$2
  shift 2
  while (($#)); do
    (($# >= 2)) || die "$1 needs a value"
    case "$1" in
      --bigmac) bigmac=$2 ;;
      --plugin) plugins+=("$2") ;;
      --gpu-test) gpu_tests+=("$2") ;;
      --gemm-peak) gemm_peak=$2 ;;
      --pingpong) pingpong=$2 ;;
      --corpus) corpus+=("$2") ;;
      *) die "unknown option $1" ;;
    esac
    shift 2
  done
  [[ -n "$bigmac" ]] || die "--assemble needs --bigmac FILE"
else
  case "${1:-}" in
    -h | --help) sed -n '2,15p' "${BASH_SOURCE[0]}"; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
  esac
  out=${1:-$repo/out/bigmac-bundle.tar.gz}
  cd "$repo"
  launch/setup.sh
  bazel=(flock -o /tmp/bazel.lock bazel)
  # The GPU tests and the GEMM peak that exist in this checkout (others are added over time).
  query() { "${bazel[@]}" query --noshow_progress "$1" 2>/dev/null || die "bazel query '$1' failed"; }
  tests_found=$(query "filter('^//tests:cuda_[A-Za-z0-9_]*test\$', kind('cc_test rule', //tests:all))")
  bench_found=$(query "filter('^//bench:cuda_gemm_peak\$', //bench:all)")
  pingpong_found=$(query "filter('^//tests:nccl_pingpong\$', //tests:all)")
  test_labels=()
  bench_labels=()
  [[ -n "$tests_found" ]] && mapfile -t test_labels <<<"$tests_found"
  [[ -n "$bench_found" ]] && mapfile -t bench_labels <<<"$bench_found"
  plugin_label=//plugins/examples/rms_swiglu:librms_swiglu.so
  labels=(//:bigmac "$plugin_label" "${test_labels[@]}" "${bench_labels[@]}" ${pingpong_found:+"$pingpong_found"})
  echo "bundle: building ${labels[*]}"
  "${bazel[@]}" build --noshow_progress "${labels[@]}"
  bin_dir=$("${bazel[@]}" info bazel-bin 2>/dev/null)
  # //pkg:name -> bazel-bin/pkg/name
  path_of() {
    local label=${1#//}
    local package=${label%%:*} name=${label#*:}
    echo "$bin_dir${package:+/$package}/$name"
  }
  bigmac=$(path_of //:bigmac)
  plugins=("$(path_of "$plugin_label")")
  for label in "${test_labels[@]}"; do gpu_tests+=("$(path_of "$label")"); done
  for label in "${bench_labels[@]}"; do gemm_peak=$(path_of "$label"); done
  if [[ -n "$pingpong_found" ]]; then pingpong=$(path_of "$pingpong_found"); fi
fi

if ((${#corpus[@]} == 0)); then
  # The demo's English text (Debian's fortunes): the GPU machine has none.
  mapfile -t corpus < <(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.*' | sort)
  ((${#corpus[@]})) || die "no corpus: install the fortunes package (launch/setup.sh) or pass --corpus"
fi
for file in "$bigmac" "${plugins[@]}" "${gpu_tests[@]}" ${gemm_peak:+"$gemm_peak"} ${pingpong:+"$pingpong"}; do
  [[ -f "$file" ]] || die "missing input file $file"
done
command -v patchelf >/dev/null || die "patchelf is missing (launch/setup.sh installs it)"
case "$out" in /*) ;; *) out=$PWD/$out ;; esac

# ---- Open MPI as Debian installed it ----------------------------------------------------------
ompi_path() { ompi_info --parsable --path "$1" | sed -n "s/^path:$1://p"; }
ompi_pkglibdir=$(ompi_path pkglibdir)  # /usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
ompi_pkgdatadir=$(ompi_path pkgdatadir) # /usr/share/openmpi
ompi_sysconfdir=$(ompi_path sysconfdir) # /etc/openmpi
ompi_bindir=$(ompi_path bindir)         # /usr/bin
[[ -d "$ompi_pkglibdir" ]] || die "Open MPI's components are not in '$ompi_pkglibdir'"
# PMIx (external, used by Open MPI's pmix/ext3x component): its components sit beside libpmix.
pmix_lib=$(bundle_ldd "$ompi_pkglibdir/mca_pmix_ext3x.so" | awk '$1 == "libpmix.so.2" { print $2 }')
[[ -n "$pmix_lib" ]] || die "cannot find libpmix.so.2 through $ompi_pkglibdir/mca_pmix_ext3x.so"
pmix_root=$(dirname "$(dirname "$(readlink -f "$pmix_lib")")") # /usr/lib/x86_64-linux-gnu/pmix2

# Components that need libraries the bundle does not carry (InfiniBand verbs, UCX, libfabric, PSM,
# netlink) or that belong to OpenSHMEM: left out. The rest (shared memory, TCP, the ORTE runtime,
# collectives, I/O) is about 5 MB.
skip_deps='^(libuc[mpst]|libpsm|libinfinipath|libfabric|libefa|libibverbs|librdmacm|liboshmem|libnl-|libmca_common_(ucx|verbs|ofi))'

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage"/{bin,libexec,lib/openmpi,lib/pmix,lib/hwloc,share/openmpi,share/pmix,etc,tests} \
  "$stage"/{plugins,configs,data,launch/bundle}

# copy FILE DIR: the file's bytes (links followed), writable for patchelf.
copy() {
  cp -L "$1" "$2/"
  chmod u+w,a+rx "$2/${1##*/}"
}
copy "$bigmac" "$stage/libexec"
for program in orterun orted ompi_info; do copy "$ompi_bindir/$program" "$stage/libexec"; done
for launcher in bigmac mpirun mpiexec orterun ompi_info; do
  install -m 0755 "$repo/launch/bundle/launcher.sh" "$stage/bin/$launcher"
done
install -m 0644 "$repo/launch/bundle/env.sh" "$stage/bin/env.sh"
if [[ -n "$gemm_peak" ]]; then copy "$gemm_peak" "$stage/bin"; fi
if [[ -n "$pingpong" ]]; then copy "$pingpong" "$stage/bin"; fi
for file in "${gpu_tests[@]}"; do copy "$file" "$stage/tests"; done
for file in "${plugins[@]}"; do copy "$file" "$stage/plugins"; done

left_out=()
for component in "$ompi_pkglibdir"/*.so; do
  deps=$(bundle_ldd "$component")
  if grep -Eq "$skip_deps" <<<"$deps" || grep -q ' not found$' <<<"$deps"; then
    left_out+=("${component##*/}")
  else
    copy "$component" "$stage/lib/openmpi"
  fi
done
for component in "$pmix_root"/lib/pmix/*.so; do copy "$component" "$stage/lib/pmix"; done
find "$ompi_pkgdatadir" -maxdepth 1 -type f ! -name '*-wrapper-data.txt' ! -name '*.supp' \
  -exec cp {} "$stage/share/openmpi/" \;
cp -r "$pmix_root"/share/pmix/. "$stage/share/pmix/"
install -m 0644 "$repo/launch/bundle/openmpi-mca-params.conf" \
  "$repo/launch/bundle/pmix-mca-params.conf" "$stage/etc/"
if [[ -f "$ompi_sysconfdir/openmpi-default-hostfile" ]]; then
  cp "$ompi_sysconfdir/openmpi-default-hostfile" "$stage/etc/"
fi

# ---- every shared library they need, but glibc's and CUDA's ------------------------------------
elf_files() {
  local file
  while IFS= read -r -d '' file; do
    if bundle_is_elf "$file"; then printf '%s\n' "$file"; fi
  done < <(find "$stage" -type f -print0 | sort -z)
}
# ldd lists the whole closure, so one pass over the programs and components finds every library.
mapfile -t elves < <(elf_files)
declare -A carried=()
for file in "${elves[@]}"; do
  while read -r soname path; do
    [[ "$soname" == VERSION-ERROR ]] && die "${file#"$stage"/}: $path"
    [[ "$path" == "not found" ]] && die "${file#"$stage"/} needs $soname, which is not found here"
    if bundle_is_glibc "$soname" || bundle_is_cuda "$soname" || [[ -n "${carried[$soname]:-}" ]]; then
      continue
    fi
    carried[$soname]=$path
    cp -L "$path" "$stage/lib/$soname"
    chmod 0755 "$stage/lib/$soname"
  done < <(bundle_ldd "$file")
done

# RUNPATH: programs look in ../lib, libraries beside themselves, components one folder up. The
# build's /usr/local/cuda entries stay behind (the CUDA fallback); no other path of this machine.
only_glibc() {
  local soname path
  while read -r soname path; do
    bundle_is_glibc "$soname" || return 1
  done < <(bundle_ldd "$1")
}
mapfile -t elves < <(elf_files)
# shellcheck disable=SC2016  # $ORIGIN is for the dynamic loader, not the shell
for file in "${elves[@]}"; do
  case "${file#"$stage"/}" in
    lib/openmpi/* | lib/pmix/*) runpath='$ORIGIN/..' ;;
    lib/*) runpath='$ORIGIN' ;;
    *) runpath='$ORIGIN/../lib' ;;
  esac
  # Libraries that need nothing but glibc keep their bytes.
  if [[ "$runpath" != '$ORIGIN/../lib' ]] && only_glibc "$file"; then continue; fi
  cuda=$(patchelf --print-rpath "$file" | tr ':' '\n' | grep '^/usr/local/cuda' | paste -sd: - || true)
  patchelf --set-rpath "$runpath${cuda:+:$cuda}" "$file"
done

# ---- configs, tiny token shards, the check scripts, the manifest ------------------------------
find "$repo/configs/" -maxdepth 1 \( -name '*.yaml' -o -name '*.textproto' \) -exec cp {} "$stage/configs/" \;
"$bigmac" data prep --input "${corpus[@]}" --output "$stage/data/tiny" >"$stage/data/prep.log"
cat "$stage/data/prep.log"
install -m 0755 "$repo/launch/device_check.sh" "$repo/launch/bundle_check.sh" "$stage/launch/"
install -m 0644 "$repo/launch/bundle/libs.sh" "$stage/launch/bundle/"

glibc_required=$(for file in "${elves[@]}"; do objdump -T "$file" 2>/dev/null; done |
  grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
revision=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [[ -n "$(git -C "$repo" status --porcelain 2>/dev/null)" ]]; then revision+="+dirty"; fi
{
  echo "BigMac bundle (docs/gpu.md)"
  echo "revision=$revision"
  echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), glibc $(getconf GNU_LIBC_VERSION | awk '{ print $2 }')"
  echo "glibc_required=$glibc_required"
  echo "open_mpi=$(ompi_info --version 2>/dev/null | sed -n 's/^Open MPI v//p')"
  echo "gpu_tests=$(find "$stage/tests" -type f -printf '%f\n' | sort | paste -sd' ' -)"
  echo "gemm_peak=${gemm_peak:+bin/${gemm_peak##*/}}"
  echo "pingpong=${pingpong:+bin/${pingpong##*/}}"
  echo "openmpi_components_left_out=${left_out[*]}"
  echo "libraries_carried=$(printf '%s\n' "${!carried[@]}" | sort | paste -sd' ' -)"
  echo "libraries_from_the_machine=${BUNDLE_GLIBC_NAMES[*]} ${BUNDLE_CUDA_NAMES[*]}"
} >"$stage/MANIFEST.txt"

# Self-check before packing: RUNPATHs alone must resolve everything but glibc and CUDA.
env -u LD_LIBRARY_PATH "$repo/launch/bundle_check.sh" "$stage" >"$stage/bundle_check.txt" ||
  die "the bundle is not self-contained: $(grep FAIL "$stage/bundle_check.txt")"

chmod -R a+rX "$stage"
mkdir -p "$(dirname "$out")"
tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner -czf "$out.tmp" .
mv "$out.tmp" "$out"
bytes=$(stat -c %s "$out")
unpacked=$(du -sb "$stage" | awk '{ print $1 }')
files=$(find "$stage" -type f | wc -l)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
echo "bundle: $out: $(mib "$bytes") MiB compressed ($(mib "$unpacked") MiB unpacked, $files files); revision $revision; needs glibc >= $glibc_required"
echo "bundle: GPU tests: $(sed -n 's/^gpu_tests=//p' "$stage/MANIFEST.txt")${gemm_peak:+; bin/${gemm_peak##*/}}${pingpong:+; bin/${pingpong##*/}}"
if ((bytes > max_mib * 1048576)); then
  die "the bundle is $(mib "$bytes") MiB, over the ${max_mib} MiB limit (it must fit beside the repo in the device tool's 64 MiB)"
fi
