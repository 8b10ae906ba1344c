# shellcheck shell=bash
# The slurm.conf lines the throwaway test clusters share (tests/slurm/run_slurm_job.sh: one node;
# launch/two_hosts.sh --slurm: two namespace hosts). Sourced; not a cluster's configuration.
#
# bigmac_throwaway_slurm_conf MUNGE_SOCKET: prints authentication, plugins and scheduling for a
# cluster in containers and VMs: no cgroups, no accounting, jobs scheduled every second, and a
# requeued job held 10 s instead of 120 (cred_expire). The caller adds the hosts, ports,
# directories, nodes and partition.
bigmac_throwaway_slurm_conf() {
  cat <<CONF
SlurmUser=$(id -un)
SlurmdUser=$(id -un)
AuthType=auth/munge
CredType=cred/munge
# cred_expire: also how long a requeued job waits before it may start again (default 120 s).
AuthInfo=socket=$1,cred_expire=10
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups (containers): track processes through /proc, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/builtin
# Every second, not every 60 s: a requeued job starts as soon as it may.
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# Nodes register as idle at once; trust the CPU counts given over what slurmd detects.
ReturnToService=2
SlurmdParameters=config_overrides
MailProg=/bin/true
KillWait=5
InactiveLimit=0
MinJobAge=300
CONF
}
