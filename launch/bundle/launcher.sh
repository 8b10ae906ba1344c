#!/bin/sh
# A launcher of the BigMac bundle, installed as bin/bigmac, bin/mpirun, bin/mpiexec,
# bin/orterun and bin/ompi_info: it sources bin/env.sh (Open MPI relocated into the bundle), then
# runs the real program from libexec/ (mpirun and mpiexec are Open MPI's orterun). The programs
# find the bundle's libraries through their RUNPATH ($ORIGIN/../lib). Built-ins only.
case $0 in
  */*) _dir=${0%/*} ;;
  *) _dir=. ;;
esac
BIGMAC_BUNDLE=$(cd "$_dir/.." && pwd -P) || exit 127
export BIGMAC_BUNDLE
# shellcheck source=launch/bundle/env.sh
. "$BIGMAC_BUNDLE/bin/env.sh"
_name=${0##*/}
case $_name in
  mpirun | mpiexec) _name=orterun ;;
esac
exec "$BIGMAC_BUNDLE/libexec/$_name" "$@"
