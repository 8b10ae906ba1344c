#!/usr/bin/env bash
# End-to-end test of launch/slurm/train.sbatch on a throwaway one-node Slurm cluster.
#
# Usage: run_slurm_job.sh BIGMAC_BIN CONFIG_FILE DATA_DIR [extra bigmac train args...]
#
# It starts its own munged, slurmctld and slurmd (Debian packages munge, slurmctld, slurmd,
# slurm-client, slurm-wlm-basic-plugins), all state in temporary directories, on ports of their
# own; it never reads or writes /etc/slurm or /etc/munge, and never touches a system daemon. It
# submits
#   sbatch -N1 -n4 --overcommit launch/slurm/train.sbatch \
#     --config CONFIG_FILE --set data.dir=DATA_DIR [extra args...]
# with BIGMAC_BIN and BIGMAC_SRUN_FLAGS=--overcommit, waits for it (bounded), prints the job's
# output, then `slurm job exit: N`, and exits with N: the job's exit status (128+signal if it was
# killed), 124 if it ran past BIGMAC_SLURM_TIMEOUT seconds, 1 if the cluster did not come up (the
# daemons' logs are printed then, and on every failure). On any exit, also on failure or
# interruption, the job is cancelled, the daemons are stopped and the temporary directories
# removed.
#
# Environment: BIGMAC_REPO (repository root; default: two levels above this script),
# BIGMAC_SLURM_RANKS (default 4), BIGMAC_SLURM_TIMEOUT (seconds for the job, default 240),
# TEST_TMPDIR (Bazel's; preferred for the temporary directory), BIGMAC_SLURM_KEEP=1 (keep the
# temporary directories, for debugging), BIGMAC_SLURM_SBATCH_FLAGS (more sbatch flags, split on
# spaces, e.g. a time limit: "--time=1 --signal=B:TERM@50"). A job that requeues itself is
# waited for until it ends for good.
# shellcheck disable=SC2317  # (functions that only the EXIT trap calls)
set -euo pipefail

usage() {
  echo "usage: ${0##*/} BIGMAC_BIN CONFIG_FILE DATA_DIR [extra bigmac train args...]" >&2
  exit 2
}
(($# >= 3)) || usage
log() { echo "run_slurm_job: $*" >&2; }
die() {
  log "error: $*"
  exit 1
}

abspath() { [[ "$1" == /* ]] && echo "$1" || echo "$PWD/$1"; }
bin=$(abspath "$1")
config=$(abspath "$2")
data=$(abspath "$3")
shift 3
[[ -x "$bin" ]] || die "bigmac binary '$bin' is missing or not executable"
[[ -f "$config" ]] || die "config '$config' not found"
[[ -d "$data" ]] || die "data directory '$data' not found"
repo=${BIGMAC_REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
script=$repo/launch/slurm/train.sbatch
# shellcheck source=../../launch/slurm/throwaway_cluster.sh
source "$repo/launch/slurm/throwaway_cluster.sh"
[[ -f "$script" ]] || die "$script not found (set BIGMAC_REPO to the repository root)"
ranks=${BIGMAC_SLURM_RANKS:-4}
job_timeout=${BIGMAC_SLURM_TIMEOUT:-240}
# If set: once the job's output holds this text, SIGTERM goes to the batch script (as before a
# time limit with --signal=B:TERM), which passes it to srun and the ranks.
term_after=${BIGMAC_SLURM_TERM_AFTER:-}

# Bazel test actions run with PATH=/bin:/usr/bin:...; the daemons are in /usr/sbin.
export PATH="$PATH:/usr/sbin:/sbin"
for tool in munged slurmctld slurmd sbatch sinfo squeue scancel scontrol srun; do
  command -v "$tool" >/dev/null || die "'$tool' not found (Debian: munge slurmctld slurmd slurm-client)"
done

# --- temporary directories --------------------------------------------------------------------
# work: config, state, logs, job output (under Bazel's TEST_TMPDIR when set, not TMPDIR or HOME,
# which a test sandbox may set oddly). run: the munge socket, slurmd's spool (step sockets, PMIx)
# and the job's TMPDIR (Open MPI's session directory), which must stay short: a unix socket path
# is limited to 107 bytes, and TEST_TMPDIR paths are long.
run=$(mktemp -d /tmp/bmslurm.XXXXXX)
chmod 0711 "$run" # munged refuses a socket directory that not all can search
if [[ -n "${TEST_TMPDIR:-}" ]]; then
  work=$(mktemp -d "$TEST_TMPDIR/slurm.XXXXXX")
else
  work=$run
fi
conf=$work/slurm.conf
# Every process started here carries this tag in its environment (the daemons, slurmstepd, the
# job and its ranks), never this shell: the last resort of cleanup finds leftovers by it.
tag="BIGMAC_SLURM_TAG=$run"
daemon_pids=()
job_id=

# The daemons' log files; a daemon's console output (stdout/stderr, which in the foreground
# repeats its log) only when it died before opening its log, e.g. on a bad slurm.conf.
print_logs() {
  local name
  for name in munged slurmctld slurmd; do
    if [[ -s "$work/$name.log" ]]; then
      echo "----- $name.log (last 40 lines) -----" >&2
      tail -n 40 "$work/$name.log" >&2
    elif [[ -s "$work/$name.console" ]]; then
      echo "----- $name console (last 40 lines) -----" >&2
      tail -n 40 "$work/$name.console" >&2
    fi
  done
}

# Processes that carry our tag, other than the daemons (one grep over /proc/PID/environ, ours
# and so readable; a zombie's environ is empty). With "job": only the job's processes
# (slurmstepd, the batch script, srun, the ranks), not the daemons' helpers (slurmscriptd).
tagged_pids() {
  local file pid ppid
  grep -lzxF "$tag" /proc/[0-9]*/environ 2>/dev/null | while IFS= read -r file; do
    pid=${file#/proc/}
    pid=${pid%/environ}
    [[ " ${daemon_pids[*]} " == *" $pid "* ]] && continue
    if [[ "${1:-}" == job ]]; then
      ppid=$(ps -o ppid= -p "$pid" 2>/dev/null) || continue
      [[ " ${daemon_pids[*]} " == *" ${ppid// /} "* ]] && continue
    fi
    echo "$pid"
  done
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  if ((rc != 0)); then print_logs; fi
  # 1. Cancel the job while slurmctld can still do it (it ran past the timeout, or we were
  #    interrupted), up to 10 s.
  if [[ -n "$job_id" ]] && [[ -n "$(squeue -h -j "$job_id" 2>/dev/null)" ]]; then
    log "cancelling job $job_id"
    scancel "$job_id" 2>/dev/null
    for _ in $(seq 20); do
      [[ -z "$(squeue -h -j "$job_id" 2>/dev/null)" ]] && break
      sleep 0.5
    done
  fi
  # 2. Let the job's slurmstepd processes finish their talk with slurmd, up to 10 s.
  for _ in $(seq 40); do
    [[ -z "$(tagged_pids job)" ]] && break
    sleep 0.25
  done
  # 3. Stop the daemons (children of this shell: started in the foreground, backgrounded here),
  #    slurmd first, munged last; SIGKILL after 10 s.
  local pid i
  for ((i = ${#daemon_pids[@]} - 1; i >= 0; i--)); do
    pid=${daemon_pids[i]}
    kill -TERM "$pid" 2>/dev/null || continue
    for _ in $(seq 20); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  # 4. Whatever still carries the tag (a slurmstepd or rank that outlived slurmd): SIGKILL.
  local -a left
  mapfile -t left < <(tagged_pids)
  if ((${#left[@]} > 0)); then
    log "killing leftover processes: ${left[*]}"
    kill -KILL "${left[@]}" 2>/dev/null
  fi
  if [[ -n "${BIGMAC_SLURM_KEEP:-}" ]]; then
    log "kept $work$([[ "$work" == "$run" ]] || echo " and $run") (BIGMAC_SLURM_KEEP)"
  else
    rm -rf "$run"
    [[ "$work" != "$run" ]] && rm -rf "$work"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- munge ------------------------------------------------------------------------------------
mkdir -p "$run/spool" "$run/tmp" "$work/state"
key=$run/munge.key
if command -v mungekey >/dev/null; then
  mungekey --create --keyfile="$key" 2>/dev/null || dd if=/dev/urandom of="$key" bs=1024 count=1 status=none
else
  dd if=/dev/urandom of="$key" bs=1024 count=1 status=none
fi
chmod 0400 "$key"
socket=$run/munge.sock
# --foreground: a child of this shell, so its pid is $! and `wait` works; it then logs to stderr
# and ignores --log-file. --force: munged's checks of file and directory permissions (which a
# sandbox may fail) warn instead of refusing to start.
env "$tag" munged --foreground --force --socket="$socket" --key-file="$key" \
  --pid-file="$run/munged.pid" --seed-file="$run/munged.seed" \
  --num-threads=2 </dev/null >"$work/munged.log" 2>&1 &
daemon_pids+=($!)
for _ in $(seq 50); do
  [[ -S "$socket" ]] && break
  kill -0 "${daemon_pids[0]}" 2>/dev/null || die "munged exited"
  sleep 0.1
done
[[ -S "$socket" ]] || die "munged did not create $socket within 5 s"

# --- slurm.conf ---------------------------------------------------------------------------------
host=$(hostname -s)
# Two free TCP ports, derived from our pid so that concurrent harnesses differ; a port that
# answers a connection is taken.
port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
base=$((20000 + ($$ * 2) % 20000))
for _ in $(seq 50); do
  if ! port_taken "$base" && ! port_taken $((base + 1)); then break; fi
  base=$((20000 + (base - 20000 + 2 + RANDOM * 2) % 20000))
done
# At least one CPU per rank: cons_tres refuses more tasks per node than CPUs even with
# --overcommit; SlurmdParameters=config_overrides lets the node claim more than it has.
cpus=$(nproc)
((cpus >= ranks)) || cpus=$ranks
: >"$work/plugstack.conf" # empty: no SPANK plugins (not /etc/slurm/plugstack.conf)
cat >"$conf" <<EOF
# Throwaway one-node cluster of tests/slurm/run_slurm_job.sh
ClusterName=bigmactest
# Job ids unique among concurrent harnesses: Open MPI names its shared-memory segments
# (/dev/shm/vader_segment.HOST.ID.RANK) after the PMIx namespace slurm.pmix.JOBID.STEP, so two
# clusters both running job 1 on one host crash each other's ranks.
FirstJobId=$(($$ % 60000000 + 1))
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$base
SlurmdPort=$((base + 1))
StateSaveLocation=$work/state
SlurmdSpoolDir=$run/spool
TmpFS=$run/tmp
SlurmctldPidFile=$run/slurmctld.pid
SlurmdPidFile=$run/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
PlugStackConfig=$work/plugstack.conf
$(bigmac_throwaway_slurm_conf "$socket")
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$conf

# --- slurmctld, slurmd ------------------------------------------------------------------------
# -D: foreground (children of this shell); -i: ignore any saved state.
env "$tag" slurmctld -D -i -f "$conf" </dev/null >"$work/slurmctld.console" 2>&1 &
daemon_pids+=($!)
env "$tag" slurmd -D -f "$conf" -N "$host" </dev/null >"$work/slurmd.console" 2>&1 &
daemon_pids+=($!)

state=
for _ in $(seq 60); do
  state=$(sinfo -h -N -n "$host" -o %t 2>/dev/null || true)
  [[ "$state" == idle ]] && break
  for pid in "${daemon_pids[@]}"; do kill -0 "$pid" 2>/dev/null || die "a daemon exited (pid $pid)"; done
  sleep 0.5
done
if [[ "$state" != idle ]]; then
  sinfo -R >&2 || true
  die "node $host not idle within 30 s (state: '${state:-none}')"
fi
log "cluster up: node $host ($cpus CPUs), slurmctld port $base, slurmd port $((base + 1)), $SECONDS s"

# --- the job ----------------------------------------------------------------------------------
# The job inherits this environment (sbatch --export=ALL): the binary, --overcommit for srun
# (more ranks than cores), Open MPI's permission to run as root, a short TMPDIR for Open MPI's
# session directory, and the tag.
export BIGMAC_BIN=$bin BIGMAC_SRUN_FLAGS=--overcommit
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$work/job"
out=$work/job.out
# --chdir: the run's outputs (runs/latest) land in the temporary directory, not the repository.
# BIGMAC_REPO is left out so that the script finds launch/slurm/common.sh the way it does on a
# cluster (through the submitted script's path; the submit directory here is not the repo).
read -r -a sbatch_flags <<<"${BIGMAC_SLURM_SBATCH_FLAGS:-}"
submitted=$(env -u BIGMAC_REPO "$tag" TMPDIR="$run/tmp" \
  sbatch --parsable -N1 -n"$ranks" --overcommit --chdir="$work/job" --output="$out" \
  "${sbatch_flags[@]}" "$script" --config "$config" --set data.dir="$data" "$@") ||
  die "sbatch failed"
job_id=${submitted%%;*}
[[ "$job_id" =~ ^[0-9]+$ ]] || die "sbatch printed '$submitted', not a job id"
# Wait for the job, bounded. Not `sbatch --wait`: it polls after 2 s, then 8 s more, then 32 s
# more, so a 4 s job costs 10 s and an 11 s job 42 s.
deadline=$((SECONDS + job_timeout))
rc=
while ((SECONDS < deadline)); do
  info=$(scontrol show job -o "$job_id" 2>/dev/null || true)
  if [[ "$info" =~ JobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|PREEMPTED|BOOT_FAIL|DEADLINE) ]]; then
    job_state=${BASH_REMATCH[1]}
    # ExitCode=status:signal, as sbatch --wait would return it (128+signal when killed).
    [[ "$info" =~ ExitCode=([0-9]+):([0-9]+) ]] || die "no ExitCode for job $job_id: $info"
    rc=${BASH_REMATCH[1]}
    ((BASH_REMATCH[2] == 0)) || rc=$((128 + BASH_REMATCH[2]))
    [[ "$job_state" == COMPLETED || "$rc" != 0 ]] || rc=1
    break
  fi
  if [[ -n "$term_after" && -f "$out" ]] && grep -qF -- "$term_after" "$out"; then
    log "job output reached '$term_after': scancel --batch --signal=TERM $job_id"
    scancel --batch --signal=TERM "$job_id" || log "scancel failed"
    term_after=
  fi
  sleep 0.5
done
if [[ -z "$rc" ]]; then
  rc=124
  log "job $job_id still running after ${job_timeout} s (BIGMAC_SLURM_TIMEOUT); cancelling it"
  job_state=TIMEOUT
fi
log "job $job_id: $job_state after $SECONDS s"
if [[ -f "$out" ]]; then cat "$out"; else log "no job output ($out)"; fi
if ((rc != 0)); then scontrol show job "$job_id" >&2 || true; fi
echo "slurm job exit: $rc"
exit "$rc"
