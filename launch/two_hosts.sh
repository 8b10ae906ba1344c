#!/usr/bin/env bash
# Two hosts for real, on one machine: trains the tiny GPT with pp=2 dp=2 (4 ranks, 2 per host)
# across two network namespaces, then the same job on this one host, and compares the per-step
# losses (bitwise). docs/launch.md, "Two hosts".
#
# Each host is a network namespace with its own address on a veth pair (hostA 10.250.16.1,
# hostB 10.250.16.2), its own hostname (a UTS namespace: Open MPI tells nodes apart by hostname),
# its own /etc/hosts naming both and its own /dev/shm (a private tmpfs: no shared memory between
# the hosts); the filesystem is shared, as a cluster shares /home. The job is launched the way a
# cluster without a scheduler launches it: launch/bigmac-mpirun --nodes 2 --hostfile on hostA,
# whose mpirun starts hostB's orted through a launch agent (this script, --agent, standing in for
# ssh); Open MPI is held to TCP (btl tcp,self, both restricted to the veth subnet). The one-host
# run is plain launch/bigmac-mpirun --cpu --np 4 on this machine (shared memory).
#
# With --slurm the two hosts are a Slurm cluster instead: munged here, slurmctld on hostA and one
# slurmd per host, and the job is `sbatch -N 2 --ntasks-per-node=2 launch/slurm/train_multinode.sbatch`
# submitted on hostA, its ranks started by `srun --mpi=pmix` on both hosts.
#
# With --lose-node the Slurm cluster has a third host, a spare: hostC (10.250.16.3; hostA's eth0
# is then a bridge with the links to hostB and hostC as its ports). A job on hostA and hostB
# trains with checkpoints until hostB is lost (its processes killed, its link down) at step 5:
# the job must end within the deadline plus 30 s and name hostB, and its batch script must
# requeue it without hostB; the requeued job runs on hostA and hostC, resumes with --resume auto
# from the last complete checkpoint and finishes.
#
# Usage: launch/two_hosts.sh [--bigmac BIN] [--steps N] [--slurm | --lose-node] [--keep]
#   --bigmac BIN  the bigmac binary (default: bazel-bin/bigmac of this checkout, or $BIGMAC_BIN)
#   --steps N     training steps (default 5)
#   --slurm       launch through a two-node Slurm cluster instead of mpirun
#   --lose-node   the lost-node scenario above instead of the comparison
#   --keep        keep the work directory (metrics, logs) and print its path
#
# Needs root, iproute2 (`ip netns`), util-linux (`unshare`), Open MPI. Exit status: 0 the losses
# are identical, 1 they differ or a run failed, 2 bad usage, 77 this machine cannot make the two
# hosts (the line `two_hosts: skipped: REASON` says why). Everything it makes (namespaces, veth,
# work directory under /tmp) is removed on exit, also on failure or interruption; leftovers of a
# run that was killed with SIGKILL are removed by the next run.
#
# Internal modes: --enter HOST CMD... (run CMD on HOST), --agent HOST WORDS... (what mpirun runs
# instead of `ssh HOST WORDS...`); both read the run's directory from BIGMAC_TWO_HOSTS_DIR.
set -euo pipefail

# Bazel test actions and sudo may leave the sbin directories off PATH (ip is in /usr/sbin).
export PATH="$PATH:/usr/sbin:/sbin"
self=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
repo=$(cd "$(dirname "$self")/.." && pwd)
subnet=10.250.16
hosts=(hostA hostB)
prefix=bm2h # namespaces bm2h<PID>a / b / c, work directory /tmp/bm2h-<PID>.XXXXXX

log() { echo "two_hosts: $*"; }
die() {
  echo "two_hosts: error: $*" >&2
  exit 1
}
skip() {
  echo "two_hosts: skipped: $*"
  exit 77
}

# --- internal modes: a process on one of the hosts ---------------------------------------------
# On HOST: its network namespace (ip netns exec, which also gives it a private mount namespace),
# a UTS namespace with its hostname, its /etc/hosts and a private /dev/shm; TMPDIR (Open MPI's
# session directory) on the host's own directory.
if [[ "${1:-}" == --enter || "${1:-}" == --agent ]]; then
  mode=$1
  host=${2:?host}
  shift 2
  dir=${BIGMAC_TWO_HOSTS_DIR:?BIGMAC_TWO_HOSTS_DIR is not set}
  [[ -f "$dir/$host.netns" ]] || die "unknown host '$host' (no $dir/$host.netns)"
  if [[ "$mode" == --agent ]]; then
    # Like ssh: the words after the host are one command line for the remote shell.
    set -- /bin/sh -c "$*"
  fi
  exec ip netns exec "$(cat "$dir/$host.netns")" unshare --uts --mount --propagation private \
    "$self" --inside "$host" "$@"
fi
if [[ "${1:-}" == --inside ]]; then
  host=$2
  shift 2
  dir=$BIGMAC_TWO_HOSTS_DIR
  hostname "$host" 2>/dev/null || echo "$host" >/proc/sys/kernel/hostname
  mount --bind "$dir/etc_hosts" /etc/hosts
  mount -t tmpfs -o size=512m,mode=1777 "shm-$host" /dev/shm
  # ip netns exec mounts a sysfs of its own, without the cgroup filesystems slurmd looks for:
  # mount them again as this machine has them (/proc/self/cgroup lists its hierarchies).
  if ! mountpoint -q /sys/fs/cgroup; then
    if [[ "$(cut -d: -f1 /proc/self/cgroup | sort -u)" == 0 ]]; then
      mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null || true
    else # cgroup v1 (or hybrid): a tmpfs with one directory per hierarchy
      mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup 2>/dev/null || true
      while IFS=: read -r id controllers _; do
        if [[ "$id" == 0 ]]; then
          mkdir -p /sys/fs/cgroup/unified
          mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified 2>/dev/null || true
        else
          cgroup_dir=${controllers#name=}
          opts=$controllers
          [[ "$controllers" == name=* ]] && opts=none,$controllers
          mkdir -p "/sys/fs/cgroup/$cgroup_dir"
          mount -t cgroup -o "$opts" cgroup "/sys/fs/cgroup/$cgroup_dir" 2>/dev/null || true
        fi
      done </proc/self/cgroup
    fi
  fi
  export TMPDIR=$dir/$host/tmp
  # --slurm: Slurm's TmpFS (PMIx's directories) is node-local, as on a cluster.
  if [[ -d "$dir/slurm/tmp" ]]; then
    mkdir -p "$dir/$host/slurm-tmp"
    mount --bind "$dir/$host/slurm-tmp" "$dir/slurm/tmp"
  fi
  exec "$@"
fi

# --- options -----------------------------------------------------------------------------------
bigmac=${BIGMAC_BIN:-$repo/bazel-bin/bigmac}
steps=5
keep=0
slurm=0
lose_node=0
while (($#)); do
  case "$1" in
    --bigmac) bigmac=${2:?--bigmac needs a path}; shift 2 ;;
    --steps) steps=${2:?--steps needs a number}; shift 2 ;;
    --keep) keep=1; shift ;;
    --slurm) slurm=1; shift ;;
    --lose-node) slurm=1; lose_node=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$self" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "two_hosts: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || { echo "two_hosts: --steps must be a positive integer" >&2; exit 2; }

# --- can this machine make two hosts? ----------------------------------------------------------
[[ $(id -u) -eq 0 ]] || skip "needs root to create network namespaces (uid $(id -u)); run: sudo $self"
[[ "$bigmac" == /* ]] || bigmac=$PWD/$bigmac
[[ -x "$bigmac" ]] || die "$bigmac is not an executable: build it (bazel build //:bigmac) or pass --bigmac"
for tool in ip unshare mount timeout mpirun; do
  command -v "$tool" >/dev/null || skip "'$tool' not found (Debian: iproute2, util-linux, coreutils, openmpi-bin)"
done

# Leftovers of runs killed before their cleanup (SIGKILL): namespaces and work directories whose
# creating process is gone.
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${prefix}[0-9]+[abc]$" || true); do
  pid=${ns#"$prefix"}
  pid=${pid%[abc]}
  kill -0 "$pid" 2>/dev/null && continue
  log "removing leftover namespace $ns (its run, pid $pid, is gone)"
  for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
  ip netns del "$ns" 2>/dev/null || true
done
for old in /tmp/"$prefix"-*; do
  [[ -d "$old" ]] || continue
  pid=${old#/tmp/"$prefix"-}
  pid=${pid%%.*}
  [[ "$pid" =~ ^[0-9]+$ ]] || continue
  # A directory kept with --keep stays.
  kill -0 "$pid" 2>/dev/null || [[ -e "$old/kept" ]] || rm -rf "$old"
done

ns_a=$prefix$$a
ns_b=$prefix$$b
ns_c=$prefix$$c
veth_a=bm$$a
veth_b=bm$$b
veth_ac=bm$$x # --lose-node: hostA's end towards hostC (a port of its bridge)
veth_c=bm$$c
work=$(mktemp -d "/tmp/$prefix-$$.XXXXXX")
made_ns=()
slurm_daemons=() # --slurm: munged, slurmctld, the slurmds
child= # the running job (timeout, mpirun and its ranks), stopped first on an interruption

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  local ns p
  if [[ -n "$child" ]] && kill -0 "$child" 2>/dev/null; then
    log "stopping the running job"
    kill -TERM "$child" 2>/dev/null # timeout passes it on to mpirun, which stops its ranks
    for _ in $(seq 20); do
      kill -0 "$child" 2>/dev/null || break
      sleep 0.25
    done
    kill -KILL "$child" 2>/dev/null
    wait "$child" 2>/dev/null
  fi
  for p in "${slurm_daemons[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for ns in "${made_ns[@]}"; do
    # A rank or orted that outlived mpirun keeps the namespace alive: kill what runs in it.
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
  # The veth pairs, if the run stopped before they were moved into the namespaces.
  ip link del "$veth_a" 2>/dev/null
  ip link del "$veth_ac" 2>/dev/null
  if ((keep)); then
    touch "$work/kept"
    log "kept $work"
  else
    rm -rf "$work"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A bazel test sandbox or a container may forbid namespaces: that is a skip, with the reason.
if ! err=$(ip netns add "$ns_a" 2>&1); then
  skip "'ip netns add' is not permitted here: ${err//$'\n'/ }"
fi
made_ns+=("$ns_a")
ip netns add "$ns_b"
made_ns+=("$ns_b")
if ! err=$(ip link add "$veth_a" type veth peer name "$veth_b" 2>&1); then
  skip "cannot create a veth pair: ${err//$'\n'/ }"
fi
if ! err=$(unshare --uts --mount true 2>&1); then
  skip "'unshare --uts --mount' is not permitted here: ${err//$'\n'/ }"
fi
# Each end becomes its host's eth0.
ip link set "$veth_a" netns "$ns_a"
ip link set "$veth_b" netns "$ns_b"
# --lose-node: hostA's eth0 is a bridge (a switch) with the links to hostB and hostC as its ports,
# so that every host has one address on one subnet, as on a cluster's network. (Two links on
# hostA gave it two addresses, and Open MPI on hostC at times refused hostA's connections from
# the address it did not expect.)
if ((lose_node)); then
  if ! err=$(ip -n "$ns_a" link add eth0 type bridge 2>&1); then
    skip "cannot create a bridge: ${err//$'\n'/ }"
  fi
  ip -n "$ns_a" link set "$veth_a" name to_b
  ip -n "$ns_a" link set to_b master eth0
  ip -n "$ns_a" link set to_b up
fi
i=1
for ns in "$ns_a" "$ns_b"; do
  end=$([[ "$ns" == "$ns_a" ]] && echo "$veth_a" || echo "$veth_b")
  ((lose_node)) && [[ "$ns" == "$ns_a" ]] || ip -n "$ns" link set "$end" name eth0
  ip -n "$ns" addr add "$subnet.$i/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  i=$((i + 1))
done

# --lose-node: the spare hostC, on a third port of hostA's bridge.
if ((lose_node)); then
  ip netns add "$ns_c"
  made_ns+=("$ns_c")
  ip link add "$veth_ac" type veth peer name "$veth_c"
  ip link set "$veth_ac" netns "$ns_a"
  ip link set "$veth_c" netns "$ns_c"
  ip -n "$ns_a" link set "$veth_ac" name to_c
  ip -n "$ns_a" link set to_c master eth0
  ip -n "$ns_a" link set to_c up
  ip -n "$ns_c" link set "$veth_c" name eth0
  ip -n "$ns_c" addr add "$subnet.3/24" dev eth0
  ip -n "$ns_c" link set eth0 up
  ip -n "$ns_c" link set lo up
  hosts+=(hostC)
fi

{
  echo "127.0.0.1 localhost"
  echo "$subnet.1 hostA"
  echo "$subnet.2 hostB"
  if ((lose_node)); then echo "$subnet.3 hostC"; fi
} >"$work/etc_hosts"
echo "$ns_a" >"$work/hostA.netns"
echo "$ns_b" >"$work/hostB.netns"
if ((lose_node)); then echo "$ns_c" >"$work/hostC.netns"; fi
for host in "${hosts[@]}"; do mkdir -p "$work/$host/tmp"; done
printf '%s slots=2\n' "${hosts[@]}" >"$work/hostfile"
export BIGMAC_TWO_HOSTS_DIR=$work
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=passive

# hostA reaches hostB over the veth: a connection to a closed port there is refused (not
# "no route to host").
reach=$(timeout 10 "$self" --enter hostA bash -c "exec 3<>/dev/tcp/$subnet.2/9" 2>&1 || true)
[[ "$reach" == *refused* ]] || die "hostA cannot reach hostB ($subnet.2) over the veth pair: $reach"
if ((lose_node)); then
  reach=$(timeout 10 "$self" --enter hostC bash -c "exec 3<>/dev/tcp/$subnet.1/9" 2>&1 || true)
  [[ "$reach" == *refused* ]] || die "hostC cannot reach hostA ($subnet.1): $reach"
fi
log "hosts up: hostA $subnet.1 (netns $ns_a), hostB $subnet.2 (netns $ns_b)$( ((lose_node)) &&
  echo ", hostC $subnet.3 (netns $ns_c; hostA's eth0 a bridge to both)")"

# --- data: a fixed corpus, byte-level shards ----------------------------------------------------
awk 'BEGIN { for (i = 0; i < 4000; i++)
  printf "Host %d sends its gradients to host %d over TCP, %d bytes per step.\n",
    i % 2, 1 - i % 2, (i * 7919) % 1000 }' >"$work/corpus.txt"
"$bigmac" data prep --input "$work/corpus.txt" --output "$work/data" >/dev/null

train_args=(
  --config "$repo/configs/tiny.yaml"
  --set "data.dir=$work/data"
  --set parallel.pp_size=2 --set parallel.schedule=1f1b
  --set parallel.num_microbatches=4 --set train.gradient_accumulation_steps=4
  --set train.micro_batch_size=2 --set train.seq_length=32
  --set model.hidden_size=32 --set model.num_heads=2
  --set "train.max_steps=$steps" --set train.log_interval=1 --set train.eval_interval=0
  --set optim.warmup_steps=2
)
run_timeout=150

# bounded LOG CMD...: runs CMD under a deadline, output to LOG, in the background so that a
# signal to this script is handled at once (bash runs a trap only after the foreground command
# ends); sets rc to its exit status.
bounded() {
  local out=$1
  shift
  timeout -k 10 "$run_timeout" "$@" >"$out" 2>&1 &
  child=$!
  rc=0
  wait "$child" || rc=$?
  child=
}

# --- --slurm: a two-node Slurm cluster over the two hosts ---------------------------------------
# munged on this machine (its socket is a file, which both hosts see), slurmctld and a slurmd on
# hostA, a slurmd on hostB, each in its host's namespaces (so every RPC, PMIx's included, crosses
# the veth pair), all configured in the work directory (nothing under /etc is read or written).
# Adds the daemons' pids to slurm_daemons; cleanup stops them with the namespaces.
slurm_up() {
  local tool
  for tool in munged slurmctld slurmd sbatch sinfo scontrol srun; do
    command -v "$tool" >/dev/null || skip "'$tool' not found (Debian: munge slurmctld slurmd slurm-client)"
  done
  local s=$work/slurm
  mkdir -p "$s/state" "$s/tmp" "$work/job"
  local host
  for host in "${hosts[@]}"; do mkdir -p "$s/spool-$host"; done
  chmod 0711 "$work" "$s"
  dd if=/dev/urandom of="$s/munge.key" bs=1024 count=1 status=none
  chmod 0400 "$s/munge.key"
  munged --foreground --force --socket="$s/munge.sock" --key-file="$s/munge.key" \
    --pid-file="$s/munged.pid" --seed-file="$s/munged.seed" --num-threads=2 \
    </dev/null >"$s/munged.log" 2>&1 &
  slurm_daemons+=($!)
  for _ in $(seq 50); do [[ -S "$s/munge.sock" ]] && break; sleep 0.1; done
  [[ -S "$s/munge.sock" ]] || die "munged did not start ($s/munged.log)"
  : >"$s/plugstack.conf"
  # shellcheck source=slurm/throwaway_cluster.sh
  source "$repo/launch/slurm/throwaway_cluster.sh"
  # 4 CPUs a node, though each host has this machine's 2. The spare hostC weighs more, so that
  # the first job of --lose-node takes hostA and hostB.
  cat >"$s/slurm.conf" <<CONF
# Two-node cluster of launch/two_hosts.sh --slurm
ClusterName=bigmac2h
SlurmctldHost=hostA($subnet.1)
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$s/state
SlurmdSpoolDir=$s/spool-%n
TmpFS=$s/tmp
SlurmctldPidFile=$s/slurmctld.pid
SlurmdPidFile=$s/slurmd-%n.pid
SlurmctldLogFile=$s/slurmctld.log
SlurmdLogFile=$s/slurmd-%n.log
PlugStackConfig=$s/plugstack.conf
# A lost node is marked down after this; the job ends sooner (train.comm_timeout_seconds), so
# its batch script, not Slurm, decides what follows.
SlurmdTimeout=30
$(bigmac_throwaway_slurm_conf "$s/munge.sock")
NodeName=hostA NodeAddr=$subnet.1 CPUs=4 State=UNKNOWN
NodeName=hostB NodeAddr=$subnet.2 CPUs=4 State=UNKNOWN
$( ((lose_node)) && echo "NodeName=hostC NodeAddr=$subnet.3 CPUs=4 Weight=10 State=UNKNOWN")
PartitionName=test Nodes=$(IFS=,; echo "${hosts[*]}") Default=YES MaxTime=INFINITE State=UP
CONF
  export SLURM_CONF=$s/slurm.conf
  "$self" --enter hostA slurmctld -D -i -f "$SLURM_CONF" </dev/null >"$s/slurmctld.console" 2>&1 &
  slurm_daemons+=($!)
  for host in "${hosts[@]}"; do
    "$self" --enter "$host" slurmd -D -f "$SLURM_CONF" -N "$host" </dev/null \
      >"$s/slurmd-$host.console" 2>&1 &
    slurm_daemons+=($!)
  done
  local idle=
  for _ in $(seq 60); do
    idle=$("$self" --enter hostA sinfo -h -N -o '%N %t' 2>/dev/null | awk '$2 == "idle"' | wc -l)
    ((idle == ${#hosts[@]})) && break
    sleep 0.5
  done
  if ((idle != ${#hosts[@]})); then
    tail -n 20 "$s"/*.log "$s"/*.console >&2 2>/dev/null
    die "the ${#hosts[@]} Slurm nodes are not idle within 30 s"
  fi
  local listed=${hosts[*]:0:${#hosts[@]}-1}
  log "slurm up: slurmctld on hostA, slurmd on ${listed// /, } and ${hosts[-1]} ($SECONDS s)"
}

# Submits `sbatch FLAGS... train_multinode.sbatch ARGS...` on hostA (FLAGS and ARGS split by
# --), its output to OUT; prints the job id. Open MPI is held to TCP on the veth subnet, and the
# sbatch header's GPUs and cores are replaced.
slurm_submit() {
  local out=$1 flags=()
  shift
  while (($#)) && [[ "$1" != -- ]]; do flags+=("$1"); shift; done
  shift
  local id
  id=$("$self" --enter hostA env BIGMAC_BIN="$bigmac" BIGMAC_REPO="$repo" \
    OMPI_MCA_btl=tcp,self OMPI_MCA_btl_tcp_if_include="$subnet.0/24" \
    OMPI_MCA_oob_tcp_if_include="$subnet.0/24" BIGMAC_SRUN_FLAGS="${srun_flags:-}" \
    ${job_env:+$job_env} \
    sbatch --parsable --cpus-per-task=1 --gpus-per-node=0 --time=5 --chdir="$work/job" \
    --output="$out" "${flags[@]}" "$repo/launch/slurm/train_multinode.sbatch" "$@") ||
    die "sbatch failed"
  echo "${id%%;*}"
}

# The job's state once it has ended (COMPLETED, FAILED, ...), waiting at most run_timeout.
slurm_wait() {
  local id=$1 info
  slurm_exit=1
  for _ in $(seq $((run_timeout * 2))); do
    info=$("$self" --enter hostA scontrol show job -o "$id" 2>/dev/null || true)
    if [[ "$info" =~ JobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL) ]]; then
      slurm_state=${BASH_REMATCH[1]}
      # ExitCode=status:signal, 128+signal when killed; a job that did not complete is no 0.
      if [[ "$info" =~ ExitCode=([0-9]+):([0-9]+) ]]; then
        slurm_exit=${BASH_REMATCH[1]}
        ((BASH_REMATCH[2] == 0)) || slurm_exit=$((128 + BASH_REMATCH[2]))
      fi
      [[ "$slurm_state" == COMPLETED || "$slurm_exit" != 0 ]] || slurm_exit=1
      return
    fi
    sleep 0.5
  done
  slurm_state=RUNNING
  slurm_exit=124
}

# --- --lose-node: hostB lost mid-training, the job requeued without it -------------------------
if ((lose_node)); then
  slurm_up
  ckpt=$work/ckpt
  total=12
  echo "== a lost node: sbatch -N 2 --ntasks-per-node=2 (on hostA and hostB; hostC spare), $total" \
    "steps, checkpoints every 2, train.comm_timeout_seconds=5; hostB lost at step 5"
  # Rank 0 sleeps 100 ms a micro-batch (a fault hook), so that the job is mid-training at the kill.
  job_env=BIGMAC_TEST_SLOW_RANK=0:100
  job=$(slurm_submit "$work/lost.log" -N 2 --ntasks-per-node=2 -- "${train_args[@]}" \
    --set "train.max_steps=$total" --set "checkpoint.dir=$ckpt" --set checkpoint.interval=2 \
    --set train.comm_timeout_seconds=5 --set "train.output_dir=$work/lost")
  job_env=
  for _ in $(seq 600); do
    grep -qs '^step 5/' "$work/lost.log" && break
    sleep 0.1
  done
  grep -qs '^step 5/' "$work/lost.log" || { cat "$work/lost.log" >&2; die "the job did not reach step 5"; }
  grep -q 'host=hostB' "$work/lost.log" || die "the job did not run on hostB"
  # As a node that loses power: its processes gone (slurmd, slurmstepd, ranks 2 and 3), its link down.
  lost_at=$SECONDS
  for p in $(ip netns pids "$ns_b" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
  ip -n "$ns_b" link set eth0 down
  ended=
  for _ in $(seq 1200); do
    grep -qs '^bigmac-slurm: bigmac train exited' "$work/lost.log" && { ended=$((SECONDS - lost_at)); break; }
    sleep 0.1
  done
  [[ -n "$ended" ]] || { cat "$work/lost.log" >&2; die "the job did not end within 120 s of the loss"; }
  echo "  the job's ranks ended ${ended} s after hostB was lost"
  slurm_wait "$job"
  echo "  slurm job $job: $slurm_state, exit $slurm_exit, $((SECONDS - lost_at)) s after hostB was lost"
  grep -E '^(bigmac: hang: no rank|bigmac-slurm|\[ckpt\] resumed|\[rank\]|step [0-9]+/)' "$work/lost.log" |
    sed 's/^/  /' || true
  grep -q 'bigmac: hang: no rank on hostB (ranks 2, 3) answers: .*excluding host hostB' "$work/lost.log" ||
    die "the hang report does not name hostB as lost"
  grep -q '^bigmac-slurm: requeueing job .* without hostB' "$work/lost.log" ||
    die "the batch script did not requeue the job without hostB"
  ((slurm_exit == 0)) || { tail -n 30 "$work/lost.log" >&2; die "the requeued job failed"; }
  requeued=$(sed -n '/^bigmac-slurm: requeued run 1 started/,$p' "$work/lost.log")
  for host in hostA hostC; do
    n=$(grep -c "^\[rank\] rank [0-9]*: .*host=$host " <<<"$requeued" || true)
    ((n == 2)) || die "expected the requeued job's 2 ranks on $host, found $n"
  done
  grep -q 'host=hostB' <<<"$requeued" && die "the requeued job ran on hostB"
  resumed=$(grep -o '^\[ckpt\] resumed from [^ ]* at step [0-9]*' <<<"$requeued" || true)
  [[ -n "$resumed" ]] || die "the requeued job did not resume from a checkpoint"
  grep -q "^step $total/$total" <<<"$requeued" || die "the requeued job did not reach step $total"
  # The first step after the checkpoint, trained again on hostA and hostC, is the step hostA and
  # hostB trained (the same layout: the same loss and norm as printed).
  again=$(( ${resumed##* } + 1 ))
  first_try=$(sed '/^bigmac-slurm: requeued run 1 started/,$d' "$work/lost.log" |
    grep -o "^step $again/$total | loss [^|]*| lr [^|]*| norm [^ ]*" || true)
  second_try=$(grep -o "^step $again/$total | loss [^|]*| lr [^|]*| norm [^ ]*" <<<"$requeued" || true)
  [[ -n "$first_try" && "$first_try" == "$second_try" ]] ||
    die "step $again differs after the requeue: '$first_try' then '$second_try'"
  echo "  step $again before the loss and after the requeue: $second_try (the same)"
  latest=$(cat "$ckpt/latest" 2>/dev/null || true)
  [[ "$latest" == "step_$(printf %06d "$total")" ]] || die "latest is '$latest', not step $total"
  echo "two_hosts: hostB lost: the job ended in ${ended} s and named it; requeued without hostB," \
    "it ${resumed#\[ckpt\] } on hostA and hostC and finished ($((SECONDS - lost_at)) s after the loss)"
  exit 0
fi

# --- the two-host run --------------------------------------------------------------------------
counters() { # bytes received and sent by hostB's eth0
  "$self" --enter hostB cat /sys/class/net/eth0/statistics/rx_bytes /sys/class/net/eth0/statistics/tx_bytes | paste -sd' '
}
read -r rx0 tx0 < <(counters)
# Open MPI splits the agent setting on spaces: a link with a space-free path to this script.
ln -s "$self" "$work/agent"
# shellcheck disable=SC2054 # (tcp,self is one word)
mca=(--mca plm_rsh_agent "$work/agent --agent" --mca plm_rsh_no_tree_spawn 1
  --mca btl tcp,self --mca btl_tcp_if_include "$subnet.0/24" --mca oob_tcp_if_include "$subnet.0/24")
mpirun_args=()
for a in "${mca[@]}"; do mpirun_args+=("--mpirun-arg=$a"); done
if ((slurm)); then
  slurm_up
  read -r rx0 tx0 < <(counters)
  echo "== two hosts under Slurm: on hostA, sbatch -N 2 --ntasks-per-node=2 launch/slurm/train_multinode.sbatch"
  # Open MPI over TCP on the veth subnet only; the sbatch header's GPUs and cores replaced.
  job=$(slurm_submit "$work/two_hosts.log" -N 2 --ntasks-per-node=2 -- "${train_args[@]}" \
    --set "train.output_dir=$work/two_hosts")
  slurm_wait "$job"
  rc=$slurm_exit
  echo "  slurm job $job: $slurm_state, exit $rc"
else
  echo "== two hosts: on hostA, launch/bigmac-mpirun --nodes 2 --cpu --np 4 --hostfile (hostA slots=2, hostB slots=2)"
  BIGMAC_BIN=$bigmac bounded "$work/two_hosts.log" "$self" --enter hostA "$repo/launch/bigmac-mpirun" \
    --nodes 2 --cpu --np 4 --hostfile "$work/hostfile" "${mpirun_args[@]}" "${train_args[@]}" \
    --set "train.output_dir=$work/two_hosts"
fi
read -r rx1 tx1 < <(counters)
grep -E '^(mpirun|bigmac-slurm|\[rank\]|step )' "$work/two_hosts.log" | sed 's/^/  /' || true
echo "  hostB eth0: received $((rx1 - rx0)) bytes, sent $((tx1 - tx0)) bytes during the run"
if ((rc != 0)); then
  tail -n 40 "$work/two_hosts.log" >&2
  die "the two-host run failed (exit $rc$( ((rc == 124)) && echo ": past ${run_timeout} s"))"
fi
for host in hostA hostB; do
  n=$(grep -c "^\[rank\] rank [0-9]*: .*host=$host local_rank=[01]/2" "$work/two_hosts.log" || true)
  ((n == 2)) || die "expected 2 ranks on $host with local_rank of 2, found $n (the [rank] lines above)"
done
(((rx1 - rx0) > 10000 && (tx1 - tx0) > 10000)) || die "hardly any traffic crossed the veth pair"

# --- the one-host run --------------------------------------------------------------------------
echo "== one host: launch/bigmac-mpirun --cpu --np 4 on this machine (shared memory)"
BIGMAC_BIN=$bigmac bounded "$work/one_host.log" "$repo/launch/bigmac-mpirun" --cpu --np 4 \
  --mpirun-arg=--mca --mpirun-arg=btl --mpirun-arg=self,vader \
  --mpirun-arg=--mca --mpirun-arg=btl_vader_single_copy_mechanism --mpirun-arg=none \
  "${train_args[@]}" --set "train.output_dir=$work/one_host"
grep -E '^(mpirun|\[rank\]|step )' "$work/one_host.log" | sed 's/^/  /' || true
if ((rc != 0)); then
  tail -n 40 "$work/one_host.log" >&2
  die "the one-host run failed (exit $rc)"
fi

# --- compare: the loss and gradient norm of every step, as metrics.jsonl wrote them ------------
field() { grep -o "\"$1\":[^,}]*" "$2" | cut -d: -f2; }
paste <(field loss "$work/two_hosts/metrics.jsonl") <(field loss "$work/one_host/metrics.jsonl") \
  <(field grad_norm "$work/two_hosts/metrics.jsonl") <(field grad_norm "$work/one_host/metrics.jsonl") \
  >"$work/compare.txt"
echo "== per-step loss from metrics.jsonl (the gradient norms are compared too), two hosts vs one host"
# As strings (awk would compare number-like fields as numbers).
awk '{ same = ($1 "" == $2 "" && $3 "" == $4 "")
  printf "  step %d  %-20s %-20s %s\n", NR, $1, $2, (same ? "identical" : "DIFFERENT") }' \
  "$work/compare.txt"
lines=$(wc -l <"$work/compare.txt")
different=$(awk 'NF != 4 || $1 "" != $2 "" || $3 "" != $4 ""' "$work/compare.txt" | wc -l)
if ((lines != steps || different != 0)); then
  die "$different of $lines steps differ (expected $steps identical steps)"
fi
echo "two_hosts: the two-host losses equal the one-host losses, bit for bit ($steps steps)"

# --- the step time over TCP against one host (a printed figure, not a check) -----------------
# The median of steps 2.. (the first pays for the start-up); both runs share this machine's cores.
median_step_ms() {
  field step_ms "$1" | tail -n +2 | sort -g | awk '{ v[NR] = $1 } END {
    if (NR == 0) { print "nan"; exit }
    printf "%.1f\n", (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}
tcp_ms=$(median_step_ms "$work/two_hosts/metrics.jsonl")
local_ms=$(median_step_ms "$work/one_host/metrics.jsonl")
awk -v t="$tcp_ms" -v l="$local_ms" 'BEGIN {
  printf "two_hosts: median step time %s ms over TCP between the hosts, %s ms on one host: %+.1f%% (the goal: within 15%%)\n",
    t, l, (l > 0 ? 100 * (t / l - 1) : 0) }'
