#!/usr/bin/env bash
# A real single-node SLURM on this machine, to try `hydra/launcher=slurm` and to test preemption and requeue:
# Debian's slurm-wlm (slurmctld + slurmd) and munge, started by this script, with one partition `local` sized to
# the machine (its CPUs and 90 % of its memory) and a `gpu` gres that holds this machine's NVIDIA GPUs (none on a
# CPU machine: declared but empty, so `gpus_per_node=0` jobs run and GPU jobs are refused at submission).
#
#   scripts/slurm_local.sh up      # installs slurm-wlm + munge with apt-get if missing (as root), starts them
#   scripts/slurm_local.sh down    # cancels its jobs and stops the daemons `up` started, by process id
#   scripts/slurm_local.sh status  # daemons, node and queue
#
# Everything it writes (slurm.conf, munge key and socket, spool, logs, pid files) lives in $FAFO_SLURM_DIR
# (default /tmp/fafo-slurm); clients find the cluster with SLURM_CONF=$FAFO_SLURM_DIR/slurm.conf, which `up` also
# links from /etc/slurm/slurm.conf when that file does not exist (and `down` removes the link). Ports: 16817/16818
# (FAFO_SLURM_PORT / FAFO_SLURMD_PORT), so a real SLURM on the default ports is left alone.
set -euo pipefail

DIR=${FAFO_SLURM_DIR:-/tmp/fafo-slurm}
CTLD_PORT=${FAFO_SLURM_PORT:-16817}
SLURMD_PORT=${FAFO_SLURMD_PORT:-16818}
CONF=$DIR/slurm.conf
ETC_CONF=/etc/slurm/slurm.conf
NODE=$(hostname -s)
export SLURM_CONF=$CONF

die() { echo "error: $*" >&2; exit 2; }

alive() { [[ -f $DIR/run/$1.pid ]] && kill -0 "$(cat "$DIR/run/$1.pid")" 2>/dev/null; }

install_packages() {
  local missing=()
  command -v munged >/dev/null || missing+=(munge)
  command -v slurmctld >/dev/null || missing+=(slurmctld)
  command -v slurmd >/dev/null || missing+=(slurmd)
  command -v sbatch >/dev/null || missing+=(slurm-client)
  ((${#missing[@]})) || return 0
  if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
    die "scripts/slurm_local.sh needs ${missing[*]} (Debian: apt-get install slurm-wlm munge) and root to run slurmd; run it as root on a Debian/Ubuntu machine"
  fi
  echo "installing ${missing[*]} with apt-get"
  apt-get update -qq >/dev/null
  # policy-rc.d in containers keeps the packages' own services from starting; ours are started below
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

write_config() {
  local hw cpus mem gpus
  hw=$(slurmd -C | head -1)                        # NodeName=... CPUs=.. Boards=.. ... RealMemory=MB
  cpus=$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$hw")
  mem=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$hw")
  mem=$((mem * 9 / 10))                            # leave the OS its share
  gpus=$(compgen -G '/dev/nvidia[0-9]*' | wc -l || true)     # this machine's NVIDIA GPUs
  {
    echo "# written by scripts/slurm_local.sh up; removed state on the next up"
    echo "ClusterName=fafo-local"
    echo "SlurmctldHost=$NODE(127.0.0.1)"
    echo "SlurmctldPort=$CTLD_PORT"
    echo "SlurmdPort=$SLURMD_PORT"
    echo "SlurmUser=root"
    echo "AuthType=auth/munge"
    echo "CredType=cred/munge"
    echo "AuthInfo=socket=$DIR/munge/munge.socket.2,cred_expire=15"   # also: a requeued job waits this long (default 120 s)
    echo "StateSaveLocation=$DIR/spool/ctld"
    echo "SlurmdSpoolDir=$DIR/spool/d"
    echo "SlurmctldPidFile=$DIR/run/slurmctld.pid"
    echo "SlurmdPidFile=$DIR/run/slurmd.pid"
    echo "SlurmctldLogFile=$DIR/log/slurmctld.log"
    echo "SlurmdLogFile=$DIR/log/slurmd.log"
    echo "ProctrackType=proctrack/linuxproc"       # no cgroups: works in containers
    echo "TaskPlugin=task/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "JobCompType=jobcomp/none"
    echo "SchedulerType=sched/backfill"
    echo "SchedulerParameters=sched_interval=2"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_CPU_Memory"
    echo "SlurmdParameters=config_overrides"
    echo "MpiDefault=none"
    echo "ReturnToService=2"
    echo "JobRequeue=1"                            # batch jobs may be requeued (preemption, time limits)
    echo "KillWait=30"                             # SIGTERM -> SIGKILL on cancel, requeue and time limit
    echo "MinJobAge=600"
    echo "GresTypes=gpu"
    echo "NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem Gres=gpu:$gpus State=UNKNOWN"
    echo "PartitionName=local Nodes=$NODE Default=YES MaxTime=INFINITE State=UP"
  } >"$CONF"
  if ((gpus)); then
    echo "Name=gpu File=/dev/nvidia[0-$((gpus - 1))]" >"$DIR/gres.conf"
  else
    echo "# gpu declared in slurm.conf (GresTypes), none on this machine" >"$DIR/gres.conf"
  fi
  echo "$cpus CPUs, ${mem} MB, $gpus GPUs"
}

wait_for() {  # wait_for SECONDS CMD...: until CMD succeeds
  local limit=$1; shift
  for _ in $(seq $((limit * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  return 1
}

start() {  # start NAME CMD...: a foreground daemon in its own session, its pid in run/NAME.pid
  local name=$1; shift
  setsid "$@" >>"$DIR/log/$name.out" 2>&1 </dev/null &
  echo $! >"$DIR/run/$name.pid"
}

node_ready() { sinfo -h -n "$NODE" -o %t | grep -Eq '^(idle|mix|alloc)'; }

up() {
  [[ $(id -u) == 0 ]] || die "scripts/slurm_local.sh up must run as root (slurmd starts jobs as their users); rerun with sudo"
  if alive slurmctld && alive slurmd && alive munged; then
    echo "already up: export SLURM_CONF=$CONF"; return 0
  fi
  down quiet
  install_packages
  rm -rf "$DIR/spool" "$DIR/run"
  mkdir -p "$DIR"/{munge,spool/ctld,spool/d,run,log}
  chmod 755 "$DIR"
  chmod 711 "$DIR/munge"                          # clients reach the socket; the key itself is 0400
  [[ -f $DIR/munge/munge.key ]] || { dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none; chmod 400 "$DIR/munge/munge.key"; }
  local sizes; sizes=$(write_config)
  start munged munged -F -f --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket.2" \
    --pid-file="$DIR/run/munged.daemon.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed"
  wait_for 10 test -S "$DIR/munge/munge.socket.2" || die "munged did not start; see $DIR/log/munged.log"
  start slurmctld slurmctld -D -c -f "$CONF"
  wait_for 30 scontrol ping || die "slurmctld did not start; see $DIR/log/slurmctld.log"
  start slurmd slurmd -D -f "$CONF" -N "$NODE"
  if ! wait_for 60 node_ready; then
    scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true
    wait_for 10 node_ready || die "slurmd did not register; see $DIR/log/slurmd.log and $DIR/log/slurmctld.log"
  fi
  if [[ ! -e $ETC_CONF ]]; then mkdir -p /etc/slurm; ln -s "$CONF" "$ETC_CONF"; fi
  echo "SLURM up: partition local on $NODE ($sizes); logs in $DIR/log"
  echo "export SLURM_CONF=$CONF"
}

down() {
  local quiet=${1:-}
  if alive slurmctld; then scancel --quiet --full -p local 2>/dev/null || true; sleep 1; fi
  for name in slurmd slurmctld munged; do
    alive "$name" || continue
    local pid; pid=$(cat "$DIR/run/$name.pid")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
    rm -f "$DIR/run/$name.pid"
  done
  if [[ -L $ETC_CONF && $(readlink "$ETC_CONF") == "$CONF" ]]; then rm -f "$ETC_CONF"; fi
  [[ $quiet ]] || echo "SLURM down (logs kept in $DIR/log)"
}

status() {
  for name in munged slurmctld slurmd; do
    if alive "$name"; then echo "$name: running (pid $(cat "$DIR/run/$name.pid"))"; else echo "$name: stopped"; fi
  done
  if alive slurmctld; then sinfo; squeue; fi
}

case ${1:-} in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: scripts/slurm_local.sh up|down|status   (state in \$FAFO_SLURM_DIR, default /tmp/fafo-slurm)" >&2; exit 2 ;;
esac
