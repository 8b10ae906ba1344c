# shellcheck shell=bash
# The shared libraries the BigMac bundle does NOT carry, in one place for launch/bundle.sh (what to
# copy) and launch/bundle_check.sh (what may resolve outside the bundle). docs/gpu.md.

# glibc's own libraries: always the target machine's. Its glibc must be at least as new as the
# newest GLIBC_x.y symbol version the bundle uses (MANIFEST.txt: glibc_required, checked by
# launch/device_check.sh). GCC's runtime (libstdc++, libgcc_s, libgomp) is not glibc: it travels.
BUNDLE_GLIBC_NAMES=(linux-vdso.so.1 ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libmvec.so.1 libdl.so.2
  libpthread.so.0 librt.so.1 libresolv.so.2 libutil.so.1 libanl.so.1 'libnss_*.so.2'
  libthread_db.so.1 libBrokenLocale.so.1 libc_malloc_debug.so.0)

# The CUDA driver and the big CUDA libraries: taken on the GPU machine from its Python wheels
# (site-packages/nvidia/*/lib) or /usr/local/cuda, through LD_LIBRARY_PATH (device_check.sh) or
# the RUNPATH entry /usr/local/cuda/lib64 of the build, kept behind the bundle's $ORIGIN/../lib.
BUNDLE_CUDA_NAMES=(libcuda.so.1 libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9
  'libcudnn_*.so.9' libnccl.so.2 libnvrtc.so.13 'libnvrtc-builtins.so.13*')

# True if the soname $1 matches one of the (glob) names after it.
bundle_matches() {
  local name=$1 pattern
  shift
  for pattern in "$@"; do
    # shellcheck disable=SC2053  # the names are globs
    [[ "$name" == $pattern ]] && return 0
  done
  return 1
}
bundle_is_glibc() { bundle_matches "$1" "${BUNDLE_GLIBC_NAMES[@]}"; }
bundle_is_cuda() { bundle_matches "$1" "${BUNDLE_CUDA_NAMES[@]}"; }

# Prints "soname path" for each library `ldd FILE` resolves, "soname not found" for each it
# cannot, and "VERSION-ERROR message" for a symbol version that a library lacks (a glibc or
# libstdc++ older than the build's: "version `GLIBC_2.36' not found (required by ...)"); nothing
# for the program interpreter, which ldd names without "=>". With BUNDLE_LDD_LIBRARY_PATH set, ldd
# runs with that LD_LIBRARY_PATH (and nothing else does).
bundle_ldd() {
  local run=()
  [[ -n "${BUNDLE_LDD_LIBRARY_PATH+set}" ]] && run=(env "LD_LIBRARY_PATH=$BUNDLE_LDD_LIBRARY_PATH")
  "${run[@]}" ldd "$1" 2>/dev/null | awk '
    /not found \(required by/ { print "VERSION-ERROR", $0; next }
    $2 == "=>" && $3 == "not" { print $1, "not found"; next }
    $2 == "=>" && $3 ~ /^\// { print $1, $3 }'
}

# True if FILE is a regular file that starts with the ELF magic.
bundle_is_elf() {
  [[ -f "$1" && "$(head -c 4 "$1" 2>/dev/null | tr -d '\0')" == $'\x7fELF' ]]
}
