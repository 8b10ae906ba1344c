# shellcheck shell=sh
# Sourced by the bundle's bin/* launchers (and by scripts that run from the bundle): Open MPI, PMIx
# and hwloc take their components, help texts and parameter files from this bundle instead of the
# paths Debian compiled in (/usr/lib/x86_64-linux-gnu/openmpi, /usr/share/openmpi, /etc/openmpi,
# .../pmix2), so the bundle works from any directory on a machine without Open MPI. docs/gpu.md.
#
#   . /path/to/bundle/bin/env.sh        (bash), or set BIGMAC_BUNDLE=/path/to/bundle first (any sh)
#
# Only shell built-ins here: the launchers run under `env -i PATH=<bundle>/bin`.
if [ -z "${BIGMAC_BUNDLE:-}" ]; then
  # bash sets BASH_SOURCE; other shells must set BIGMAC_BUNDLE before sourcing.
  # shellcheck disable=SC3028
  _bigmac_src=${BASH_SOURCE:-}
  case $_bigmac_src in
    */*) ;;
    '') echo "env.sh: set BIGMAC_BUNDLE to the bundle's directory before sourcing it" >&2; return 1 ;;
    *) _bigmac_src=./$_bigmac_src ;;
  esac
  BIGMAC_BUNDLE=$(cd "${_bigmac_src%/*}/.." && pwd -P) || return 1
  unset _bigmac_src
fi
export BIGMAC_BUNDLE

# Open MPI 4.1 (opal installdirs "env" component): every directory Debian's layout uses.
# orted (started by a singleton's MPI_Init, or by mpirun on other nodes) is looked up in BINDIR.
export OPAL_PREFIX="$BIGMAC_BUNDLE"
export OPAL_EXEC_PREFIX="$BIGMAC_BUNDLE"
export OPAL_BINDIR="$BIGMAC_BUNDLE/libexec"
export OPAL_SBINDIR="$BIGMAC_BUNDLE/libexec"
export OPAL_LIBEXECDIR="$BIGMAC_BUNDLE/libexec"
export OPAL_LIBDIR="$BIGMAC_BUNDLE/lib"
export OPAL_INCLUDEDIR="$BIGMAC_BUNDLE/include"
export OPAL_DATAROOTDIR="$BIGMAC_BUNDLE/share"
export OPAL_DATADIR="$BIGMAC_BUNDLE/share"
export OPAL_SHAREDSTATEDIR="$BIGMAC_BUNDLE/share"
export OPAL_SYSCONFDIR="$BIGMAC_BUNDLE/etc"             # openmpi-mca-params.conf, default hostfile
export OPAL_PKGDATADIR="$BIGMAC_BUNDLE/share/openmpi"   # help-*.txt
export OPAL_PKGLIBDIR="$BIGMAC_BUNDLE/lib/openmpi"      # the MCA components (mca_*.so)
export OMPI_MCA_mca_base_component_path="$BIGMAC_BUNDLE/lib/openmpi"
# PMIx 4 (Debian's external libpmix, used by Open MPI's pmix/ext3x component).
export PMIX_PREFIX="$BIGMAC_BUNDLE"
export PMIX_EXEC_PREFIX="$BIGMAC_BUNDLE"
export PMIX_LIBDIR="$BIGMAC_BUNDLE/lib"
export PMIX_DATADIR="$BIGMAC_BUNDLE/share"
export PMIX_PKGDATADIR="$BIGMAC_BUNDLE/share/pmix"
export PMIX_PKGLIBDIR="$BIGMAC_BUNDLE/lib/pmix"
export PMIX_SYSCONFDIR="$BIGMAC_BUNDLE/etc"
export PMIX_MCA_mca_base_component_path="$BIGMAC_BUNDLE/lib/pmix"
# hwloc: no plugins from the host (another hwloc's plugins would not match this libhwloc).
export HWLOC_PLUGINS_PATH="$BIGMAC_BUNDLE/lib/hwloc"

case ":${PATH:-}:" in
  *":$BIGMAC_BUNDLE/bin:"*) ;;
  *) export PATH="$BIGMAC_BUNDLE/bin${PATH:+:$PATH}" ;;
esac
