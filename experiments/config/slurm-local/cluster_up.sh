#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, to check the project's cluster path for real:
# sbatch/srun and Snakemake's SLURM executor with the profile beside this script.
#
#   experiments/config/slurm-local/cluster_up.sh        # install if missing, start, check
#   experiments/config/slurm-local/cluster_up.sh down   # stop the daemons it started
#   snakemake --profile experiments/config/slurm-local densenet_fig2_contiguous
#
# Needs root on Debian (checked on Debian 12, Slurm 22.05): it installs `slurm-wlm` and `munge`
# with apt-get when they are missing, writes /etc/slurm/slurm.conf and starts munged, slurmctld
# and slurmd. Idempotent: a second call rewrites nothing that is unchanged, starts only what is
# not running, and checks that a job runs (`srun true`). Not for CI, and not a substitute for a
# real site's setup.
#
# The cluster it makes, and what that means for Snakemake:
# - one node (this host) with all its CPUs and 3/4 of its memory, in one partition `main`
#   (the default one); the slurm-local profile names it (`slurm_partition: main`).
# - no accounting database (slurmdbd): `sacct` answers "accounting storage is disabled", so
#   Snakemake must query job states with `--slurm-status-command squeue` (the slurm-local
#   profile sets it). squeue shows a finished job for MinJobAge (300 s) after it ends, long
#   enough for the executor's status checks. A real site with accounting keeps the default.
# - no cgroups (containers seldom have them): proctrack/linuxproc and task/none, so memory and
#   CPU requests are scheduled but not enforced.
# - no GPUs configured (no GRES): a job asking for `--gpus` is rejected, so the one-node check
#   runs the smoke (CPU) profile.
set -euo pipefail

CONF=/etc/slurm/slurm.conf
PIDFILES=(/run/slurmd.pid /run/slurmctld.pid /run/munge/munged.pid)

die() { echo "cluster_up.sh: $*" >&2; exit 1; }

if [[ ${1:-up} == down ]]; then
  # Stop only the daemons whose pid files this setup names (slurmd, slurmctld, munged).
  for pidfile in "${PIDFILES[@]}"; do
    [[ -s $pidfile ]] && kill "$(cat "$pidfile")" 2>/dev/null && echo "stopped $pidfile" || true
  done
  # The executor plugin runs `scontrol show config` whenever snakemake starts; with no
  # controller that call waits ~9 s, in every snakemake command (docs/cluster.md).
  if python -c "import snakemake_executor_plugin_slurm" 2>/dev/null; then
    echo "SLURM is down but snakemake-executor-plugin-slurm is installed: every snakemake" \
         "command now waits ~9 s on scontrol. Uninstall it: pip uninstall -y" \
         "snakemake-executor-plugin-slurm snakemake-executor-plugin-slurm-jobstep"
  fi
  exit 0
fi
[[ ${1:-up} == up ]] || die "unknown argument '$1' (allowed: up, down)"
[[ $(id -u) == 0 ]] || die "must run as root (it installs packages and starts daemons)"

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
    || ! command -v munged >/dev/null; then
  command -v apt-get >/dev/null || die "slurm-wlm and munge are not installed and there is no apt-get"
  echo "installing slurm-wlm and munge ..."
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
fi

# munge: the key and the directories the daemon insists on (owned by munge, not world-readable).
mkdir -p /etc/slurm /var/spool/slurmd /var/spool/slurmctld /var/log/slurm \
         /run/munge /var/log/munge /var/lib/munge /etc/munge
[[ -f /etc/munge/munge.key ]] || /usr/sbin/mungekey -c
chown -R munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge
chmod 700 /etc/munge; chmod 400 /etc/munge/munge.key

# slurm.conf for one node; no cgroup.conf (task/none and proctrack/linuxproc do not read it).
host=$(hostname -s)
mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 3 / 4 ))
conf=$(cat <<CONFEOF
# Written by experiments/config/slurm-local/cluster_up.sh: a one-node cluster, no accounting.
ClusterName=local
SlurmctldHost=$host
SlurmUser=root
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmdSpoolDir=/var/spool/slurmd
StateSaveLocation=/var/spool/slurmctld
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MinJobAge=300
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=$host CPUs=$(nproc) RealMemory=$mem_mb State=UNKNOWN
PartitionName=main Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONFEOF
)
changed=false
if [[ ! -f $CONF || $(cat "$CONF") != "$conf" ]]; then
  printf '%s\n' "$conf" > "$CONF"; changed=true
fi
rm -f /etc/slurm/cgroup.conf

pgrep -x munged >/dev/null || su -s /bin/sh munge -c /usr/sbin/munged
munge -n | unmunge >/dev/null || die "munge does not answer: see /var/log/munge/munged.log"
if pgrep -x slurmctld >/dev/null; then
  $changed && scontrol reconfigure
else
  /usr/sbin/slurmctld
fi
pgrep -x slurmd >/dev/null || /usr/sbin/slurmd

for _ in $(seq 30); do
  sinfo -h -o %t 2>/dev/null | grep -q -E '^(idle|mix|alloc)' && break
  sleep 1
done
sinfo -h -o %t 2>/dev/null | grep -q -E '^(idle|mix|alloc)' \
  || die "the node did not come up: see /var/log/slurm/slurmctld.log and slurmd.log"
timeout 60 srun -N1 -n1 true || die "srun failed: see /var/log/slurm/"
sinfo
echo "SLURM is up: one node ($host), partition main"
