# shellcheck shell=bash
# Shared launch logic of the BigMac sbatch scripts (train.sbatch, train_multinode.sbatch).
# Sourced, not run: `source common.sh && bigmac_slurm_train "$@"`.
#
# This file only touches the launch layer (docs/config.md): how many ranks, on which nodes, with
# which devices. Everything about the model and the schedule is in the config file and the --set
# arguments, which pass through to `bigmac train` untouched.
#
# Environment it reads (all optional):
#   BIGMAC_BIN          the bigmac binary (default: $SLURM_SUBMIT_DIR/bazel-bin/bigmac)
#   BIGMAC_SRUN_FLAGS   extra srun flags, split on spaces (e.g. "--overcommit" for CPU-only tests)
#   OMP_NUM_THREADS     threads per rank; default: --cpus-per-task if given, else bigmac divides
#                       the node's cores by the ranks on the node
#   OMP_WAIT_POLICY     default passive: ranks that share cores must not spin-wait
#   BIGMAC_MAX_REQUEUES most times a job requeues itself, after a stop before its time limit or a
#                       lost node (default 5; 0: never); Slurm's own requeues count too
#   BIGMAC_REQUEUE_WITHIN a stop requeues only this close to the time limit, in seconds (default
#                       900); an earlier one is an operator's (scancel --batch --signal=TERM)
#
# Time limits: the sbatch headers ask for SIGTERM before the limit (--signal=B:TERM@N) and allow
# requeueing (--requeue). On the signal the ranks stop after the step in progress, write a
# checkpoint and exit with code 10 (unfinished; docs/exit_codes.md); the script then requeues the
# job (scontrol requeue), and the requeued job (SLURM_RESTART_COUNT > 0) resumes with
# --resume auto. Slurm's own requeue after a node failure (--requeue) resumes the same way.
#
# A lost node: the ranks' hang report names the hosts none of whose ranks answer and writes them
# to BIGMAC_LOST_HOSTS_FILE (set here to a file in the submit directory, which the nodes share);
# the job ends (code 6). When the partition has enough other nodes up
# (a spare), the script requeues the job with those hosts excluded (ExcNodeList), counted against
# BIGMAC_MAX_REQUEUES, and the requeued job resumes with --resume auto; otherwise it says how to
# resubmit.

bigmac_slurm_die() {
  echo "bigmac-slurm: error: $*" >&2
  exit 1
}

# Runs `srun --mpi=pmix [BIGMAC_SRUN_FLAGS] BIGMAC_BIN train "$@"` in the current job allocation
# and exits with its status.
bigmac_slurm_train() {
  [[ -n "${SLURM_JOB_ID:-}" ]] ||
    bigmac_slurm_die "not inside a Slurm job; submit with: sbatch ${0##*/} --config CONFIG [--set k=v ...]"
  (($# > 0)) ||
    bigmac_slurm_die "no arguments for 'bigmac train'; usage: sbatch ${0##*/} --config CONFIG [--set k=v ...]"

  local bin=${BIGMAC_BIN:-${SLURM_SUBMIT_DIR:-$PWD}/bazel-bin/bigmac}
  if [[ ! -f "$bin" || ! -x "$bin" ]]; then
    bigmac_slurm_die "bigmac binary '$bin' is missing or not executable; build it with" \
      "'bazel build //:bigmac' in the repository root and submit from there, or set BIGMAC_BIN"
  fi

  # --- layout, from Slurm's variables -------------------------------------------------------
  # SLURM_NTASKS is set when -n or --ntasks-per-node was given; SLURM_NTASKS_PER_NODE only with
  # --ntasks-per-node; SLURM_TASKS_PER_NODE always (e.g. "4", "8(x2)" or "3,2" when uneven).
  local nodes=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
  local per_node=${SLURM_NTASKS_PER_NODE:-${SLURM_TASKS_PER_NODE:-1}}
  local ranks=${SLURM_NTASKS:-}
  if [[ -z "$ranks" ]]; then
    if [[ "$per_node" =~ ^[0-9]+$ ]]; then ranks=$((nodes * per_node)); else ranks=$nodes; fi
  fi
  # SLURM_GPUS_ON_NODE is set when GPUs were allocated; SLURM_GPUS_PER_NODE (may read "h100:8")
  # when --gpus-per-node was given. Neither: CPU backend.
  local gpus=${SLURM_GPUS_ON_NODE:-${SLURM_GPUS_PER_NODE:-0}}
  gpus=${gpus##*:}

  # --- threads -------------------------------------------------------------------------------
  # Ranks on a node share its cores (CPU backend); spinning OpenMP threads of one rank would
  # starve the others while they wait on the pipeline.
  export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
  if [[ -n "${SLURM_CPUS_PER_TASK:-}" ]]; then
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$SLURM_CPUS_PER_TASK}
    # Since Slurm 22.05, srun does not inherit --cpus-per-task from sbatch.
    export SRUN_CPUS_PER_TASK=${SRUN_CPUS_PER_TASK:-$SLURM_CPUS_PER_TASK}
  fi

  # --- launch --------------------------------------------------------------------------------
  # --kill-on-bad-exit: one rank failing ends the step instead of leaving its peers blocked in MPI.
  # GPUs are not bound per task: every rank sees the node's GPUs and bigmac picks its device by
  # local rank (core/comm/device.cc).
  local -a extra=()
  read -r -a extra <<<"${BIGMAC_SRUN_FLAGS:-}"
  local -a args=()
  local restarts=${SLURM_RESTART_COUNT:-0}
  if ((restarts > 0)); then
    # The newest checkpoint, whatever the first run resumed from: a --resume of the submitted
    # command line would throw away every earlier requeue's progress.
    while (($#)); do
      case "$1" in
        --resume) shift 2 || shift ;;
        --resume=*) shift ;;
        *) args+=("$1"); shift ;;
      esac
    done
    args+=(--resume auto)
    echo "bigmac-slurm: requeued run ${restarts} started $(date -u +%FT%TZ): resuming with" \
      "--resume auto"
  else
    args=("$@")
  fi
  local -a cmd=(srun --mpi=pmix --kill-on-bad-exit=1 "${extra[@]}" "$bin" train "${args[@]}")
  # Where the ranks name a lost node's hosts: the submit directory, which the nodes share.
  export BIGMAC_LOST_HOSTS_FILE=${SLURM_SUBMIT_DIR:-$PWD}/.bigmac-lost-hosts.${SLURM_CLUSTER_NAME:-slurm}.${SLURM_JOB_ID}
  rm -f "$BIGMAC_LOST_HOSTS_FILE"

  echo "bigmac-slurm: job ${SLURM_JOB_ID} (${SLURM_JOB_NAME:-bigmac}): nodes=${nodes}" \
    "[${SLURM_JOB_NODELIST:-?}] ranks=${ranks} ranks_per_node=${per_node} gpus_per_node=${gpus}" \
    "omp_threads=${OMP_NUM_THREADS:-auto}"
  local shown
  printf -v shown '%q ' "${cmd[@]}"
  echo "bigmac-slurm: + ${shown% }"

  # srun runs in the background so that the signal traps below run while it is going (bash
  # defers traps until a foreground command ends).
  "${cmd[@]}" &
  BIGMAC_SLURM_SRUN_PID=$!
  # SIGUSR1 (if a site's header asks for it): only logged.
  trap 'echo "bigmac-slurm: SIGUSR1: the time limit is near" >&2' USR1
  # --signal=B:TERM@120 in the sbatch header, or scancel --batch --signal=TERM: pass SIGTERM on to
  # the ranks as a signal to the job's steps (scancel --signal without --batch signals the steps
  # and cancels nothing). Not `kill -TERM srun`: srun takes that as "terminate the step" and
  # SIGKILLs the ranks after KillWait. The ranks agree to stop after the current step, write a
  # final checkpoint (checkpoint.dir) and exit 10; the job is then requeued (below).
  BIGMAC_SLURM_GOT_TERM=
  trap 'echo "bigmac-slurm: SIGTERM, stopping the training step" >&2
        BIGMAC_SLURM_GOT_TERM=1
        scancel --signal=TERM "$SLURM_JOB_ID" 2>/dev/null ||
          kill -TERM "$BIGMAC_SLURM_SRUN_PID" 2>/dev/null || true' TERM

  local rc=0
  wait "$BIGMAC_SLURM_SRUN_PID" || rc=$?
  # A trapped signal interrupts `wait` (status > 128) while srun is still running: wait again.
  while kill -0 "$BIGMAC_SLURM_SRUN_PID" 2>/dev/null; do
    rc=0
    wait "$BIGMAC_SLURM_SRUN_PID" || rc=$?
  done
  trap - USR1 TERM
  echo "bigmac-slurm: bigmac train exited with status ${rc}"
  # Unfinished after a stop signal: code 10 (stopped after a step, with a checkpoint), or a stop
  # during start-up (143/130: nothing trained, nothing lost) when the signal came to this script.
  if ((rc == 10)) || { [[ -n "$BIGMAC_SLURM_GOT_TERM" ]] && ((rc == 143 || rc == 130)); }; then
    bigmac_slurm_requeue "$rc" "$restarts"
  fi
  if ((rc == 6)) && [[ -s "$BIGMAC_LOST_HOSTS_FILE" ]]; then
    local lost
    lost=$(sort -u "$BIGMAC_LOST_HOSTS_FILE" | paste -sd, -)
    rm -f "$BIGMAC_LOST_HOSTS_FILE"
    bigmac_slurm_requeue_without "$rc" "$restarts" "$lost" "$nodes"
  fi
  exit "$rc"
}

# Requeues this job without the hosts LOST (comma-separated host names, as the ranks saw them)
# when the partition has NODES nodes up besides them, unless BIGMAC_MAX_REQUEUES requeues were
# made already; exits 0 when requeued, returns otherwise (saying how to go on).
bigmac_slurm_requeue_without() {
  local rc=$1 restarts=$2 lost=$3 nodes=$4 max=${BIGMAC_MAX_REQUEUES:-5}
  [[ "$max" =~ ^[0-9]+$ ]] || bigmac_slurm_die "BIGMAC_MAX_REQUEUES='$max' is not a count"
  local partition=${SLURM_JOB_PARTITION:-} table
  # NodeName, NodeHostName and state of the partition's nodes: a rank names its host as
  # gethostname() does, which may be the NodeHostName, or a longer form of it, not the NodeName.
  table=$(sinfo -h -N ${partition:+-p "$partition"} -o '%N %n %t' 2>/dev/null) || table=
  local names
  names=$(awk -v lost="$lost" '
      BEGIN { n = split(lost, hosts, ","); for (i = 1; i <= n; ++i) {
        is_lost[hosts[i]] = 1; short = hosts[i]; sub(/\..*/, "", short); is_lost[short] = 1 } }
      ($1 in is_lost) || ($2 in is_lost) { print $1 }' <<<"$table" | sort -u | paste -sd, -)
  [[ -n "$names" ]] || names=$lost
  local resubmit="resubmit with --exclude=${names} and --resume auto"
  echo "bigmac-slurm: lost node(s): ${names} (status ${rc})"
  if ((restarts >= max)); then
    echo "bigmac-slurm: ${restarts} requeue(s) made, the most BIGMAC_MAX_REQUEUES=${max}" \
      "allows: not requeueing; ${resubmit}"
    return
  fi
  # The nodes the job excludes already (Slurm prints them compressed: node[01-03]).
  local info excluded=
  info=$(scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null) || info=
  if [[ -z "$table" || -z "$info" ]]; then
    echo "bigmac-slurm: cannot read the partition's nodes or the job (sinfo, scontrol):" \
      "not requeueing; ${resubmit}"
    return
  fi
  excluded=$(sed -n 's/.* ExcNodeList=\([^ ]*\).*/\1/p' <<<"$info")
  if [[ -n "$excluded" && "$excluded" != "(null)" ]]; then
    excluded=$(scontrol show hostnames "$excluded" 2>/dev/null | paste -sd, -) || excluded=
  else
    excluded=
  fi
  local all_excluded=$names${excluded:+,$excluded}
  # Up: not down, drained or draining, failing, in maintenance, reserved, rebooting, unknown or
  # not responding (a trailing *). Features, GRES and --constraint are not checked.
  local up
  up=$(awk -v skip=",${all_excluded}," 'index(skip, "," $1 ",") == 0 &&
      $3 !~ /down|drain|drng|fail|maint|unk|boot|inval|futr|resv|npc|\*/ { print $1 }' \
    <<<"$table" | sort -u | wc -l)
  if ((up < nodes)); then
    echo "bigmac-slurm: no spare node: ${up} node(s) up in partition ${partition:-?} besides" \
      "${all_excluded}, the job needs ${nodes}; not requeueing; ${resubmit}"
    return
  fi
  echo "bigmac-slurm: requeueing job ${SLURM_JOB_ID} without ${all_excluded} (requeue" \
    "$((restarts + 1)) of at most ${max}, BIGMAC_MAX_REQUEUES; ${up} node(s) up) at" \
    "$(date -u +%FT%TZ); should it stay held: scontrol release ${SLURM_JOB_ID}, or scancel it"
  # Held while the exclusion is set (a running job's node list cannot change), then released.
  # Slurm signals this script when the job is requeued: the three commands finish first.
  trap '' TERM
  if ! scontrol requeuehold "$SLURM_JOB_ID"; then
    echo "bigmac-slurm: scontrol requeuehold failed (was the job submitted with --requeue?);" \
      "${resubmit}"
    return
  fi
  if ! scontrol update JobId="$SLURM_JOB_ID" ExcNodeList="$all_excluded"; then
    # Released now it would run again on the lost node: it stays held.
    echo "bigmac-slurm: the job is held, but its exclusion could not be set: scancel" \
      "${SLURM_JOB_ID} and ${resubmit}"
    exit "$rc"
  fi
  scontrol release "$SLURM_JOB_ID" ||
    echo "bigmac-slurm: scontrol release failed: the job is held; scontrol release ${SLURM_JOB_ID}"
  exit 0
}

# Seconds left before the job's time limit (squeue's %L: [days-][hours:]minutes:seconds), or
# nothing when unlimited or unknown.
bigmac_slurm_time_left() {
  local left days=0 h=0 m=0 sec=0
  left=$(squeue -h -j "$SLURM_JOB_ID" -o %L 2>/dev/null) || return 0
  [[ "$left" =~ ^(([0-9]+)-)?(([0-9]+):)?([0-9]+):([0-9]+)$ ]] || return 0
  days=${BASH_REMATCH[2]:-0} h=${BASH_REMATCH[4]:-0} m=${BASH_REMATCH[5]} sec=${BASH_REMATCH[6]}
  echo $(((10#$days * 24 + 10#$h) * 3600 + 10#$m * 60 + 10#$sec))
}

# Requeues this job (it must have been submitted with --requeue) unless BIGMAC_MAX_REQUEUES
# requeues were made already, or the stop came long before the time limit (more than
# BIGMAC_REQUEUE_WITHIN seconds left, default 900: an operator's scancel --signal=TERM, which
# ends the job); exits 0 when requeued, returns otherwise.
bigmac_slurm_requeue() {
  local rc=$1 restarts=$2 max=${BIGMAC_MAX_REQUEUES:-5} within=${BIGMAC_REQUEUE_WITHIN:-900}
  [[ "$max" =~ ^[0-9]+$ ]] || bigmac_slurm_die "BIGMAC_MAX_REQUEUES='$max' is not a count"
  [[ "$within" =~ ^[0-9]+$ ]] || bigmac_slurm_die "BIGMAC_REQUEUE_WITHIN='$within' is not seconds"
  if ((restarts >= max)); then
    echo "bigmac-slurm: unfinished (status ${rc}) after ${restarts} requeue(s), the most" \
      "BIGMAC_MAX_REQUEUES=${max} allows: not requeueing; resubmit with --resume auto"
    return
  fi
  local left
  left=$(bigmac_slurm_time_left)
  if [[ -n "$left" ]] && ((left > within)); then
    echo "bigmac-slurm: unfinished (status ${rc}), stopped ${left} s before the time limit" \
      "(more than BIGMAC_REQUEUE_WITHIN=${within}): a stop, not the time limit; not requeueing;" \
      "resubmit with --resume auto"
    return
  fi
  echo "bigmac-slurm: unfinished (status ${rc}): requeueing job ${SLURM_JOB_ID}" \
    "(requeue $((restarts + 1)) of at most ${max}, BIGMAC_MAX_REQUEUES) at $(date -u +%FT%TZ)"
  if ! scontrol requeue "$SLURM_JOB_ID"; then
    echo "bigmac-slurm: scontrol requeue failed (was the job submitted with --requeue?);" \
      "resubmit with --resume auto"
    return
  fi
  exit 0
}
