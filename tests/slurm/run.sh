#!/bin/bash
# `make test-slurm`: the cluster path on a real SLURM. Installs slurm-wlm and munge from the
# distribution when missing (root only), starts a one-node cluster on localhost (munged, slurmctld,
# slurmd, a generated slurm.conf), runs .test/config/config.yaml through --profile profiles/slurm with
# snakemake-executor-plugin-slurm, checks that its tables equal a local run's, and shuts it down.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
if [ "$(id -u)" != 0 ]; then
  echo "test-slurm: skipped, it needs root to install and start slurmctld/slurmd/munged"
  exit 0
fi
command -v slurmctld > /dev/null && command -v munged > /dev/null ||
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge > /dev/null

# Job steps (srun inside the batch job) read the default /etc/slurm/slurm.conf whatever SLURM_CONF
# says, so the generated one goes there: never on a machine that has its own.
if [ -e /etc/slurm/slurm.conf ]; then
  echo "test-slurm: skipped, /etc/slurm/slurm.conf exists (a real SLURM machine; use a throw-away one)"
  exit 0
fi
work=$(mktemp -d /tmp/diversed-slurm.XXXXXX)
host=$(hostname -s)
cleanup() {
  scancel --user root 2> /dev/null || true
  pkill -x slurmd 2> /dev/null || true
  pkill -x slurmctld 2> /dev/null || true
  [ -f "$work/munged.pid" ] && kill "$(cat "$work/munged.pid")" 2> /dev/null || true
  for _ in $(seq 50); do pgrep -x slurmctld > /dev/null || pgrep -x slurmd > /dev/null || break; sleep 0.2; done
  rm -f /etc/slurm/slurm.conf
  rm -rf "$work"
}
trap cleanup EXIT

# munge: its own key and socket under $work, so a machine's own munged is left alone
mkdir -p "$work/munge" "$work/state" "$work/spool" "$work/log"
dd if=/dev/urandom bs=1 count=1024 of="$work/munge/munge.key" status=none
chown -R munge:munge "$work/munge" 2> /dev/null || true
chmod 700 "$work/munge"
chmod 400 "$work/munge/munge.key"
munged --force --key-file "$work/munge/munge.key" --socket "$work/munge/socket" \
  --pid-file "$work/munged.pid" --log-file "$work/log/munged.log" --seed-file "$work/munge/seed"
export MUNGE_SOCKET="$work/munge/socket"

cpus=$(nproc)
mem=$(($(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 2048))
cat > "$work/slurm.conf" << CONF
ClusterName=diversed-ci
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$work/munge/socket
CredType=cred/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.log
SlurmctldPort=16817
SlurmdPort=16818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
MpiDefault=none
ReturnToService=2
MinJobAge=600
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=ci Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
mkdir -p /etc/slurm
cp "$work/slurm.conf" /etc/slurm/slurm.conf
slurmctld
slurmd
for _ in $(seq 30); do sinfo -h -o %T 2> /dev/null | grep -qx idle && break; sleep 1; done
sinfo

# the workflow, once locally and once through the cluster, each in its own copy
for mode in local slurm; do
  mkdir -p "$work/$mode"
  cp -r "$here/workflow" "$here/config" "$here/.test" "$here/environment.yml" "$here/profiles" "$here/diversed" "$work/$mode/"
done
(cd "$work/local" && snakemake --configfile .test/config/config.yaml --cores 2 > "$work/log/local.log" 2>&1) ||
  { tail -n 30 "$work/log/local.log"; exit 1; }
start=$(date +%s)
(cd "$work/slurm" && snakemake --profile profiles/slurm --configfile .test/config/config.yaml --jobs 2 \
  --slurm-status-command squeue --latency-wait 5 --seconds-between-status-checks 2 \
  --default-resources slurm_account=ci slurm_partition=ci runtime=30 mem_mb=4000 cpus_per_task=1 \
  --set-resources decode:mem_mb=4000 collect_traces:mem_mb=4000 \
  > "$work/log/slurm.log" 2>&1) || {
  tail -n 40 "$work/log/slurm.log"
  find "$work/slurm/.snakemake/slurm_logs" -name "*.log" -exec tail -n 20 {} +
  tail -n 20 "$work/slurm/results/logs/"*.log
  exit 1
}
jobs=$(grep -c "Job .* has been submitted with SLURM jobid" "$work/log/slurm.log" || true)
echo "test-slurm: $jobs jobs ran as SLURM jobs in $(($(date +%s) - start)) s"
[ "$jobs" -gt 0 ] || { echo "test-slurm: no job went through SLURM"; tail -n 40 "$work/log/slurm.log"; exit 1; }
# the tables: the same figures, apart from seconds and tokens per second
python3 - "$work/local/results/tables/main.csv" "$work/slurm/results/tables/main.csv" << 'PY'
import csv, sys
def table(path):
    rows = list(csv.DictReader(open(path)))
    return [{k: v for k, v in row.items() if "s/example" not in k and "tok/s" not in k and "speed-up" not in k} for row in rows]
local, slurm = (table(p) for p in sys.argv[1:])
assert local == slurm, "tables differ between the local and the SLURM run"
print(f"test-slurm: the SLURM run's table equals the local run's ({len(local)} rows)")
PY
