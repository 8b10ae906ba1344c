#!/usr/bin/env bash
# Checks that a BigMac bundle is self-contained: every shared library of every ELF file in it
# (programs, tests, plugins, libraries, Open MPI and PMIx components) resolves inside the bundle,
# except glibc's own and the CUDA libraries the GPU machine provides (launch/bundle/libs.sh). Each
# offending file and library is named; exit 1 if there is any. docs/gpu.md.
#
#   launch/bundle_check.sh BUNDLE_DIR [--list] [--ld-library-path PATH]
#
# ldd runs with the caller's LD_LIBRARY_PATH, or with PATH given (device_check.sh passes
# <bundle>/lib:<CUDA dirs>: what the GPU machine loads); with none it checks the RUNPATHs alone
# ($ORIGIN/../lib). --list prints every resolution, not only the problems.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=launch/bundle/libs.sh
source "$here/bundle/libs.sh"

usage() { echo "usage: bundle_check.sh BUNDLE_DIR [--list] [--ld-library-path PATH]" >&2; exit 2; }
(($# >= 1)) || usage
bundle=$(cd "$1" && pwd -P)
shift
list=0
while (($#)); do
  case "$1" in
    --list) list=1; shift ;;
    --ld-library-path) (($# >= 2)) || usage; export BUNDLE_LDD_LIBRARY_PATH=$2; shift 2 ;;
    *) usage ;;
  esac
done

files=0
resolved=0
problems=0
declare -A cuda_seen=()
while IFS= read -r -d '' file; do
  bundle_is_elf "$file" || continue
  files=$((files + 1))
  rel=${file#"$bundle"/}
  while read -r soname path; do
    if [[ "$soname" == VERSION-ERROR ]]; then
      echo "bundle_check: FAIL $rel: $path"
      problems=$((problems + 1))
      continue
    fi
    if [[ "$path" == "not found" ]]; then
      echo "bundle_check: FAIL $rel needs $soname: not found"
      problems=$((problems + 1))
      continue
    fi
    real=$(readlink -f "$path")
    ((list)) && echo "bundle_check: $rel: $soname => $real"
    if bundle_is_glibc "$soname"; then
      continue
    elif bundle_is_cuda "$soname"; then
      if [[ "$real" == "$bundle"/* ]]; then
        echo "bundle_check: FAIL $rel: the CUDA library $soname was carried into the bundle ($real); the GPU machine provides it"
        problems=$((problems + 1))
      fi
      cuda_seen[$soname]=$real
    elif [[ "$real" == "$bundle"/* ]]; then
      resolved=$((resolved + 1))
    else
      echo "bundle_check: FAIL $rel needs $soname: resolves outside the bundle, to $real"
      problems=$((problems + 1))
    fi
  done < <(bundle_ldd "$file")
done < <(find "$bundle" -type f -print0 | sort -z)

cuda_list=""
for soname in $(printf '%s\n' "${!cuda_seen[@]}" | sort); do
  cuda_list+=" $soname=${cuda_seen[$soname]}"
done
echo "bundle_check: $files ELF files, $resolved library references inside the bundle, CUDA from the machine:${cuda_list:- none}"
if ((problems)); then
  echo "bundle_check: FAILED: $problems library reference(s) not satisfied by the bundle (above)"
  exit 1
fi
echo "bundle_check: ok (ldd with LD_LIBRARY_PATH=${BUNDLE_LDD_LIBRARY_PATH-${LD_LIBRARY_PATH:-<unset>}})"
