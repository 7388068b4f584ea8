#!/usr/bin/env bash
# A private Slurm cluster on the namespace hosts of netns.sh, for run.sh's slurm case: munged
# and slurmctld on node0, a slurmd on every host, with every file (config, munge key and socket,
# state, spool, logs) under one directory. /etc/slurm, /etc/munge and the system's daemons are
# not touched. Sourced after netns.sh (mn_setup must have made the hosts); functions:
#   slurm_missing            prints what is missing to run Slurm here (nothing: it can run)
#   slurm_start DIR N        starts munged, slurmctld and slurmds on node0..node{N-1}, their
#                            files under DIR (every directory above it searchable by all, for
#                            munged); exports SLURM_CONF; waits until the nodes are idle
#   slurm_wait JOB SECONDS   waits for job JOB to end (at most SECONDS); prints its state and
#                            run time; succeeds when it COMPLETED (exit code 0)
#   slurm_logs               prints the daemons' logs (for a failure)
# Every daemon runs inside a namespace host, so mn_teardown ends them all, also after the
# harness itself was killed (the next run's mn_setup tears down what it left).
#
# Facts this relies on (Debian 12: slurm-wlm 22.05.8, munge 0.5.15, Open MPI 4.1.4 with PMIx 4):
# - One munged serves every host: clients reach it through its socket file, and a Unix socket
#   bound to a path is reachable from any network namespace (only abstract ones are per
#   namespace). munged refuses a socket whose parent directories are not searchable by all
#   ("execute permissions for all required"), hence the chmod of the mktemp directory.
# - `ip netns exec` mounts a fresh /sys for the namespace, without /sys/fs/cgroup's mounts, and
#   slurmd loads its cgroup plugin even with proctrack/pgid and task/affinity: its "autodetect"
#   then fails ("No filesystem mounted on /sys/fs/cgroup"). cgroup.conf names cgroup/v1 with an
#   empty directory as the mount point, which initializes and is never used.
# - The nodes share one file system, so per-node paths use slurmd's %n (its NodeName). srun
#   --mpi=pmix's stepd makes its PMIx directory TmpFS/spmix_appdir_<uid>_<job>.<step>, the same
#   path on every node ("Cannot create directory ...: File exists" on the second one): each slurmd
#   runs in a mount namespace of its own (the one `ip netns exec` makes, a slave of the root's, so
#   nothing shows outside) with a per-node directory bind-mounted on TmpFS.
# - Each host has its own network, so slurmctld and slurmd listen on Slurm's default ports
#   (6817, 6818) on the hosts' addresses without clashing with anything outside.
# - Root runs everything: SlurmUser=root, and jobs run as the submitting user (root).

# What is missing to run Slurm here; prints nothing when nothing is.
slurm_missing() {
  local c missing=()
  for c in munged mungekey slurmctld slurmd sbatch srun sinfo; do
    command -v "$c" >/dev/null || missing+=("$c")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "needs Slurm and munge (no ${missing[*]}; apt-get install slurmctld slurmd munge, or cmake/install-deps.sh)"
  fi
}

SLURM_DIR=

slurm_start() {
  local dir=$1 n=$2 i h nodes
  SLURM_DIR=$dir
  mkdir -p "$dir/munge" "$dir/state" "$dir/log" "$dir/cgroup" "$dir/tmp"
  nodes=node0
  ((n > 1)) && nodes="node[0-$((n - 1))]"
  for ((i = 0; i < n; i++)); do mkdir -p "$dir/spool/node$i" "$dir/tmp.node$i"; done

  # (set -e does not hold inside a function called as a condition: each step checks itself.)
  mungekey --create --keyfile="$dir/munge/munge.key" || return 1
  mn_exec node0 munged --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/munged.seed" ||
    { echo "slurm: munged did not start"; return 1; }

  cat > "$dir/slurm.conf" <<EOF
ClusterName=shardmn
SlurmctldHost=node0($(mn_addr node0))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
TmpFS=$dir/tmp
MailProg=/bin/true
ProctrackType=proctrack/pgid
TaskPlugin=task/affinity
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
# Every host sees all of this machine's cores; each is given 2 (config_overrides: Slurm takes
# the configured count, not the hardware's).
SlurmdParameters=config_overrides
NodeName=$nodes CPUs=2 Sockets=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN
PartitionName=shard Nodes=$nodes Default=YES State=UP
EOF
  cat > "$dir/cgroup.conf" <<EOF
CgroupPlugin=cgroup/v1
CgroupAutomount=no
CgroupMountpoint=$dir/cgroup
EOF
  # sbatch, srun, sinfo and the daemons read it from there (not /etc/slurm).
  export SLURM_CONF=$dir/slurm.conf

  # The daemons fork into the background once they are set up (mn_exec's timeout ends with the
  # parent) and stay in their host's namespaces.
  mn_exec node0 slurmctld || { echo "slurm: slurmctld did not start"; return 1; }
  for ((i = 0; i < n; i++)); do
    h=node$i
    # shellcheck disable=SC2016  # $0, $1 and $2 are for the inner shell
    mn_exec "$h" /bin/sh -c 'mount --bind "$1" "$2" && exec slurmd' "$h" "$dir/tmp.$h" "$dir/tmp" ||
      { echo "slurm: slurmd did not start on $h"; return 1; }
  done
  local state=
  for _ in $(seq 150); do
    # "idle*" would be a node that stopped answering
    state=$(mn_exec node0 sinfo -h -N -o '%N %T' 2>/dev/null || true)
    [ "$(grep -c ' idle$' <<< "$state")" -eq "$n" ] && return 0
    sleep 0.2
  done
  echo "slurm: the nodes did not come up idle in 30 s (sinfo: $(echo "${state:-no answer}" | tr '\n' ' '))"
  return 1
}

# `sbatch --wait` would do, but it polls at growing intervals (2 s, then 4, 8, ...): it returned
# 30 s after a job of 10 s. scontrol shows an ended job for MinJobAge (300 s by default).
slurm_wait() {
  local job=$1 limit=$2 info state t0=$SECONDS
  while :; do
    info=$(mn_exec node0 scontrol show job -o "$job" 2>&1 || true)
    state=$(grep -o 'JobState=[A-Z_]*' <<< "$info" | cut -d= -f2 || true)
    case $state in
      PENDING | CONFIGURING | RUNNING | COMPLETING | SUSPENDED | "") ;;
      *) break ;;
    esac
    if ((SECONDS - t0 >= limit)); then
      echo "slurm: job $job still ${state:-unknown} after $limit s: $info"
      mn_exec node0 scancel "$job" || true
      return 1
    fi
    sleep 0.25
  done
  echo "slurm: job $job $state, $(grep -o 'RunTime=[^ ]*\|ExitCode=[^ ]*' <<< "$info" | tr '\n' ' ')"
  [ "$state" = COMPLETED ]
}

slurm_logs() {
  local f
  for f in "$SLURM_DIR"/log/*.log; do
    echo "---- $f"
    tail -n 40 "$f"
  done
}
