#!/usr/bin/env bash
# Copy of the project's shared/scripts/slurm-up.sh (used when ../shared is not next to the
# checkout); .ci/test prefers the shared one.
# slurm-up.sh - throwaway multi-node Slurm cluster on ONE Linux host (as root).
#
# Tested: Debian 12 bookworm, Slurm 22.05.8 (Debian packages), munge 0.5.15,
# no systemd (daemons are started by hand and stopped by PID).
#
#   slurm-up.sh up [NODES]   # install (if needed) + start munged, slurmctld, NODES slurmd
#   slurm-up.sh down         # cancel jobs, stop everything this script started, clean up
#   slurm-up.sh status
#
# Virtual nodes are n1..nN. Each runs its own slurmd (slurmd -N nX, own Port,
# own spool dir) inside its own UTS namespace, so `hostname` inside a task
# prints nX. /etc/hosts gets "127.0.2.X nX" (loopback addresses only).
#
# Environment knobs:
#   SLURM_CI_DIR       state/log/config folder        (default /tmp/slurm-ci)
#   SLURM_CI_NODES     number of virtual nodes         (default 2; arg 2 of `up` wins)
#   SLURM_CI_CPUS      CPUs declared per virtual node  (default: nproc)
#   SLURM_CI_KILLWAIT  seconds between SIGTERM and SIGKILL on cancel/timeout (default 10)
#   SLURM_CI_PROCTRACK auto | cgroup | linuxproc | pgid (default auto: cgroup if the
#                      cgroup v1 freezer is mounted, else linuxproc)
#   SLURM_CI_NO_UTS=1  do not use UTS namespaces (tasks then all see the real hostname)
#
# Client commands (sbatch, srun, squeue, scontrol, scancel) find the config
# through /etc/slurm/slurm.conf (a symlink made here when that path is free)
# or through `export SLURM_CONF=$SLURM_CI_DIR/slurm.conf`.
set -euo pipefail

DIR=${SLURM_CI_DIR:-/tmp/slurm-ci}
CONF=$DIR/slurm.conf
KILLWAIT=${SLURM_CI_KILLWAIT:-10}
PROCTRACK=${SLURM_CI_PROCTRACK:-auto}
if [ "$PROCTRACK" = auto ]; then
  # proctrack/cgroup (what real clusters use) needs the cgroup v1 freezer hierarchy
  if [ -d /sys/fs/cgroup/freezer ]; then PROCTRACK=cgroup; else PROCTRACK=linuxproc; fi
fi
MARK="# slurm-ci"

log() { echo "[slurm-up] $*" >&2; }

wait_gone() { # pid timeout_s
  local pid=$1 t=$(( $2 * 10 ))
  while kill -0 "$pid" 2>/dev/null && [ $t -gt 0 ]; do sleep 0.1; t=$((t - 1)); done
  ! kill -0 "$pid" 2>/dev/null
}

up() {
  local n=${1:-${SLURM_CI_NODES:-2}}
  if [ -f "$DIR/run/slurmctld.pid" ] && kill -0 "$(cat "$DIR/run/slurmctld.pid")" 2>/dev/null; then
    log "already up (slurmctld pid $(cat "$DIR/run/slurmctld.pid")); run down first"; return 1
  fi
  local cpus=${SLURM_CI_CPUS:-$(nproc)}
  local t0; t0=$(date +%s%N)

  # 1. packages (slurm-wlm metapackage is NOT needed; it pulls ~20 extra plugin packages)
  if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
     || ! command -v srun >/dev/null || ! command -v munged >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      slurmctld slurmd slurm-client munge >&2
  fi

  mkdir -p "$DIR"/{state,log,run}
  for i in $(seq 1 "$n"); do mkdir -p "$DIR/spool/n$i"; done

  # 2. munge: key (the Debian postinst normally creates one) + daemon, run as user munge
  if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    mungekey --create --keyfile=/etc/munge/munge.key
  fi
  chown munge:munge /etc/munge /etc/munge/munge.key
  chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key
  install -d -o munge -g munge -m 0755 /run/munge /var/lib/munge /var/log/munge
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    log "munged already running; reusing it (will not stop it on down)"
  else
    runuser -u munge -- /usr/sbin/munged
    local w=50; while [ ! -s /run/munge/munged.pid ] && [ $w -gt 0 ]; do sleep 0.1; w=$((w - 1)); done
    cp /run/munge/munged.pid "$DIR/run/munged.pid"   # marks it as ours
    munge -n | unmunge >/dev/null
  fi

  # 3. names for the virtual nodes (loopback only). Append/rewrite in place:
  #    /etc/hosts may be a bind mount (containers), so no sed -i / mv.
  for i in $(seq 1 "$n"); do
    grep -q "^127\.0\.2\.$i n$i " /etc/hosts || echo "127.0.2.$i n$i $MARK" >> /etc/hosts
  done

  # 4. config
  cat > "$CONF" <<EOF
ClusterName=ci
SlurmctldHost=localhost
SlurmctldPort=6817
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
MailProg=/bin/true
ProctrackType=proctrack/$PROCTRACK
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# start batch jobs without the default up-to-3 s batching delay
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
# credential lifetime; also the delay before a requeued job may start again (default 120 s)
AuthInfo=cred_expire=10
ReturnToService=2
# trust the NodeName lines even if they declare more CPUs than the host has (SLURM_CI_CPUS)
SlurmdParameters=config_overrides
KillWait=$KILLWAIT
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
EOF
  if [ "$PROCTRACK" = cgroup ]; then
    printf 'CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nConstrainCores=no\nConstrainRAMSpace=no\nConstrainDevices=no\n' > "$DIR/cgroup.conf"
  fi
  for i in $(seq 1 "$n"); do
    echo "NodeName=n$i NodeHostname=n$i NodeAddr=127.0.2.$i Port=$((17000 + i)) CPUs=$cpus RealMemory=1000 State=UNKNOWN" >> "$CONF"
  done
  echo "PartitionName=debug Nodes=n[1-$n] Default=YES MaxTime=INFINITE State=UP" >> "$CONF"

  mkdir -p /etc/slurm
  if [ ! -e /etc/slurm/slurm.conf ] || [ "$(readlink /etc/slurm/slurm.conf)" = "$CONF" ]; then
    ln -sfn "$CONF" /etc/slurm/slurm.conf
  else
    log "/etc/slurm/slurm.conf exists and is not ours: export SLURM_CONF=$CONF"
  fi
  export SLURM_CONF=$CONF

  # 5. daemons (each daemonizes itself and writes its pid file)
  slurmctld -f "$CONF" -c          # -c: start from empty state
  local uts=1
  if [ "${SLURM_CI_NO_UTS:-0}" = 1 ] || ! unshare --uts true 2>/dev/null; then uts=0; fi
  for i in $(seq 1 "$n"); do
    if [ $uts = 1 ]; then
      unshare --uts -- sh -c 'hostname "$1" && exec slurmd -f "$2" -N "$1"' sh "n$i" "$CONF"
    else
      slurmd -f "$CONF" -N "n$i"
    fi
  done

  # 6. wait until all nodes are idle (normally < 3 s)
  local tries=300
  until [ "$(sinfo -h -N -o '%T' 2>/dev/null | grep -c '^idle$')" = "$n" ]; do
    tries=$((tries - 1))
    if [ $tries -le 0 ]; then
      log "nodes not idle after 30 s"; sinfo -N -l >&2 || true
      tail -n 20 "$DIR"/log/*.log >&2 || true
      return 1
    fi
    sleep 0.1
  done
  log "cluster up: $n nodes in $(( ($(date +%s%N) - t0) / 1000000 )) ms; export SLURM_CONF=$CONF"
}

down() {
  export SLURM_CONF=$CONF
  if [ -f "$CONF" ] && [ -f "$DIR/run/slurmctld.pid" ] && kill -0 "$(cat "$DIR/run/slurmctld.pid")" 2>/dev/null; then
    local jobs; jobs=$(squeue -h -o %i 2>/dev/null || true)
    if [ -n "$jobs" ]; then
      # shellcheck disable=SC2086
      scancel $jobs || true
      local t=$(( (KILLWAIT + 10) * 10 ))
      while [ -n "$(squeue -h -o %i 2>/dev/null)" ] && [ $t -gt 0 ]; do sleep 0.1; t=$((t - 1)); done
    fi
  fi
  # SIGTERM all slurmd + slurmctld at once (each takes ~2 s to exit), then munged (only if we started it)
  local f pid group
  for group in "$DIR/run/slurm*.pid" "$DIR/run/munged.pid"; do
    local pids=()
    for f in $group; do
      [ -f "$f" ] || continue
      pid=$(cat "$f")
      if kill -0 "$pid" 2>/dev/null; then kill -TERM "$pid"; pids+=("$pid"); fi
    done
    for pid in "${pids[@]}"; do
      wait_gone "$pid" 15 || { log "pid $pid ignored SIGTERM; SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; }
    done
    if [ -n "${SLURM_CI_DEBUG:-}" ]; then log "stopped $(basename "$group") at $(date +%T.%3N)"; fi
  done
  if [ "$(readlink /etc/slurm/slurm.conf 2>/dev/null)" = "$CONF" ]; then rm -f /etc/slurm/slurm.conf; fi
  if grep -q "$MARK\$" /etc/hosts; then
    local tmp; tmp=$(mktemp)
    grep -v "$MARK\$" /etc/hosts > "$tmp" || true
    cat "$tmp" > /etc/hosts; rm -f "$tmp"
  fi
  # empty per-node cgroups left by proctrack/cgroup (/sys/fs/cgroup/<ctrl>/slurm_nX)
  find /sys/fs/cgroup -mindepth 2 -maxdepth 2 -type d -name 'slurm_n[0-9]*' 2>/dev/null \
    | while read -r d; do find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null || true; done
  rm -rf "$DIR"
  log "cluster down"
}

status() {
  export SLURM_CONF=$CONF
  sinfo -N -l; squeue
}

[ "$(id -u)" = 0 ] || { echo "slurm-up.sh: run as root" >&2; exit 1; }

case "${1:-}" in
  up) up "${2:-}" ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up [NODES] | down | status" >&2; exit 2 ;;
esac
