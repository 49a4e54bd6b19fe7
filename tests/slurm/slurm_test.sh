#!/usr/bin/env bash
# Four Slurm batch jobs share one device (host backend) of one node, with contrib/slurm's
# gres.conf and TaskProlog, on real daemons: munged, slurmctld and slurmd, started here with a
# private configuration in a temp dir (ports on loopback), and always stopped again.
#
# usage: slurm_test.sh <slurm_job_worker> <vramswapd> <contrib/slurm dir>
#
# Two jobs go to the partition "main" and take turns under the lock (one opts in with the
# vramswap count GRES, one with a GPU shard); two go to the
# low-priority partition "low", for which the TaskProlog sets VRAMSWAP_OVERSUBSCRIBE=1, and
# run beside them without the lock. Every job verifies every byte it wrote (the worker exits
# nonzero otherwise). A fifth job does not ask for the vramswap GRES and must get no settings.
# Checked: all jobs COMPLETED with exit 0 (scontrol: no slurmdbd needed), each job's VRAMSWAP_*
# environment, that the four ran at the same time, that the lock turns never overlapped,
# that the time-sharing jobs swapped and the low-priority ones had pool frames taken back.
# Exit 77 (ctest: skipped) only where the daemons cannot run: not root, or Slurm/munge missing.
set -euo pipefail

# Absolute: slurmd runs the TaskProlog only by a full path, and the jobs start elsewhere.
worker=$(realpath "$1") vramswapd=$(realpath "$2") contrib=$(realpath "$3")
jobs=4 bytes=$((40 << 20)) oversub_bytes=$((8 << 20)) turns=6 hold_ms=100 oversub_s=3

skip() {
  echo "SKIP: $*" >&2
  exit 77
}
[[ $(id -u) -eq 0 ]] || skip "the Slurm daemons (slurmd runs jobs as their users) and munged need root here; run as root (CI does)"
for b in munged munge slurmctld slurmd sbatch scontrol sinfo squeue; do
  command -v "$b" >/dev/null || skip "$b is not installed: run scripts/install-deps.sh (apt-get install slurmd slurmctld slurm-client munge)"
done
for f in "$worker" "$vramswapd" "$contrib/vramswap-taskprolog.sh" "$contrib/gres.conf"; do
  [[ -e $f ]] || { echo "FAIL: $f is missing (build slurm_job_worker and vramswapd; contrib/slurm is in the source tree)" >&2; exit 1; }
done

# munged checks that its socket's directory and every one above it can be entered by all.
tmp=$(mktemp -d /tmp/vramswap-slurm.XXXXXX)
chmod 755 "$tmp"
mkdir -p "$tmp"/{munge,msock,state,spool,log,run,out,barrier,vramswap}
chmod 700 "$tmp/munge" "$tmp/vramswap"
chmod 755 "$tmp/msock" "$tmp/out"
pids=()
ok=0

teardown() {
  local rc=$?
  # Jobs first (their processes are slurmd's children), then the daemons, by the pids started here.
  if [[ -n ${SLURM_CONF:-} ]] && [[ -e $tmp/run/slurmctld.pid ]]; then
    scancel --quiet --full "${job_ids[@]:-0}" 2>/dev/null || true
  fi
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [[ -s $tmp/munge/munged.pid ]] && kill "$(cat "$tmp/munge/munged.pid")" 2>/dev/null || true
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
  if ((!ok)); then
    echo "---- FAILED; the daemons' and jobs' logs follow ($tmp) ----" >&2
    for f in "$tmp"/log/* "$tmp"/munge/munged.log "$tmp"/out/*; do
      [[ -f $f ]] || continue
      echo "==== $f" >&2
      tail -n 60 "$f" >&2
    done
  fi
  rm -rf "$tmp"
  exit "$rc"
}
trap teardown EXIT
trap 'exit 1' INT TERM

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# Two free loopback ports (slurmctld, slurmd) among those the kernel does not give out itself.
port_free() { ! grep -qi ":$(printf '%04X' "$1") " /proc/net/tcp /proc/net/tcp6 2>/dev/null; }
pick_port() {
  local p
  for _ in $(seq 100); do
    p=$((20000 + RANDOM % 12000))
    port_free "$p" && port_free "$((p + 1))" && { echo "$p"; return; }
  done
  fail "no two free TCP ports in 20000-32000 on this machine"
}
ctld_port=$(pick_port)
slurmd_port=$((ctld_port + 1))

# munge: its own key, socket, pid, log and seed; Slurm reaches it through AuthInfo=socket=.
dd if=/dev/urandom of="$tmp/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$tmp/munge/munge.key"
munged --socket="$tmp/msock/munge.sock" --key-file="$tmp/munge/munge.key" --pid-file="$tmp/munge/munged.pid" \
  --log-file="$tmp/munge/munged.log" --seed-file="$tmp/munge/munged.seed" --num-threads=2 ||
  fail "munged did not start (its log: $tmp/munge/munged.log)"
munge -n -S "$tmp/msock/munge.sock" | unmunge -S "$tmp/msock/munge.sock" >/dev/null ||
  fail "munged at $tmp/msock/munge.sock does not answer munge/unmunge"

# The node as it is (slurmd -C: CPUs, sockets, cores, threads), with at most 1 GiB of memory.
node=$(hostname -s)
hw=$(slurmd -C | head -n 1 | tr ' ' '\n' | grep -E '^(CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore|RealMemory)=' | tr '\n' ' ')
mem=$(echo "$hw" | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
((mem > 1024)) && hw=${hw/RealMemory=$mem/RealMemory=1024}

export SLURM_CONF=$tmp/slurm.conf
# contrib's count GRES as it is, and GPU shards as a GPU node has them (README.md), with an
# empty file standing in for /dev/nvidia0: slurmd only needs the file to exist.
cp "$contrib/gres.conf" "$tmp/gres.conf"
touch "$tmp/fake-nvidia0"
printf 'Name=gpu File=%s\nName=shard Count=%d File=%s\n' "$tmp/fake-nvidia0" "$jobs" "$tmp/fake-nvidia0" >>"$tmp/gres.conf"
cat >"$SLURM_CONF" <<EOF
ClusterName=vramswaptest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$tmp/msock/munge.sock
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/run/slurmctld.pid
SlurmdPidFile=$tmp/run/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SchedulerParameters=sched_interval=1
TaskProlog=$contrib/vramswap-taskprolog.sh
GresTypes=gpu,shard,vramswap
NodeName=$node NodeAddr=127.0.0.1 $hw Gres=gpu:1,shard:$jobs,vramswap:$jobs State=UNKNOWN
PartitionName=main Nodes=$node Default=YES MaxTime=5 OverSubscribe=FORCE:$((jobs + 1)) State=UP
PartitionName=low Nodes=$node MaxTime=5 OverSubscribe=FORCE:$((jobs + 1)) PriorityTier=1 State=UP
EOF
# The TaskProlog's settings (next to slurm.conf). The jobs are submitted with --export=NONE:
# every VRAMSWAP_* variable they have comes from here, through the TaskProlog. The prefix
# keeps this pool's segments apart from any other vramswap user of this machine.
prefix=slurmtest$$-
cat >"$tmp/vramswap-slurm.conf" <<EOF
runtime_dir=$tmp/vramswap
low_partitions=low
extra="VRAMSWAP_BACKEND=host VRAMSWAP_SHM_PREFIX=$prefix VRAMSWAP_LOG=warn"
EOF

slurmctld -D -i >"$tmp/log/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D >"$tmp/log/slurmd.out" 2>&1 &
pids+=($!)

# The node's pool server as a node service (docs/deploy.md, "Slurm", says why not on demand).
VRAMSWAP_BACKEND=host VRAMSWAP_SHM_PREFIX=$prefix VRAMSWAP_RUNTIME_DIR=$tmp/vramswap VRAMSWAP_FRAME_SIZE=2MiB \
  VRAMSWAP_LOG=warn "$vramswapd" --device 0 --foreground --service --pool-size 64MiB >"$tmp/log/vramswapd.log" 2>&1 &
pids+=($!)

state=""
for _ in $(seq 300); do
  state=$(sinfo -h -n "$node" -p main -o %T 2>/dev/null || true)
  [[ $state == idle ]] && break
  sleep 0.1
done
[[ $state == idle ]] || fail "node $node is not idle 30 s after slurmctld and slurmd started (state: '${state:-no answer}'; logs below)"
for _ in $(seq 100); do
  [[ -S $tmp/vramswap/${prefix}host-0.sock ]] && break
  sleep 0.1
done
[[ -S $tmp/vramswap/${prefix}host-0.sock ]] || fail "vramswapd did not listen at $tmp/vramswap/${prefix}host-0.sock within 10 s"

cat >"$tmp/job.sh" <<EOF
#!/bin/sh
env | grep '^VRAMSWAP_' | sort | sed 's/^/env /'
exec "$worker" "$tmp/barrier" $jobs "\$1" $turns $hold_ms $oversub_s
EOF
chmod 755 "$tmp/job.sh"
job_ids=()
submit() {  # <name> <partition> <bytes> [sbatch options...]
  local name=$1 part=$2 size=$3 id
  shift 3
  id=$(sbatch --parsable --export=NONE -J "$name" -p "$part" -o "$tmp/out/$name.out" "$@" "$tmp/job.sh" "$size") ||
    fail "sbatch of job $name (partition $part) failed"
  job_ids+=("${id%%;*}")
}
submit main-1 main $bytes --gres=vramswap:1
submit main-2 main $bytes --gres=shard:1  # the other opt-in: a GPU shard
submit low-1 low $oversub_bytes --gres=vramswap:1
submit low-2 low $oversub_bytes --gres=vramswap:1
plain=$(sbatch --parsable --export=NONE -J plain -p main -o "$tmp/out/plain.out" --wrap 'env | grep "^VRAMSWAP_" | sed "s/^/env /"; true') ||
  fail "sbatch of the job without the GRES failed"
job_ids+=("$plain")
echo "submitted jobs ${job_ids[*]} to node $node (slurmctld port $ctld_port)"

for _ in $(seq 1200); do
  [[ -z $(squeue -h -j "$(IFS=,; echo "${job_ids[*]}")" -o %i 2>/dev/null) ]] && break
  sleep 0.1
done
left=$(squeue -h -j "$(IFS=,; echo "${job_ids[*]}")" -o '%i %j %T %R' 2>/dev/null || true)
[[ -z $left ]] || fail "jobs still queued or running after 120 s: $left"

# Completed with exit 0, each, from slurmctld's record (kept MinJobAge seconds, 300 by default).
for id in "${job_ids[@]}"; do
  rec=$(scontrol show job -o "$id") || fail "scontrol show job $id failed"
  name=$(sed -n 's/.*JobName=\([^ ]*\).*/\1/p' <<<"$rec")
  st=$(sed -n 's/.*JobState=\([^ ]*\).*/\1/p' <<<"$rec")
  ec=$(sed -n 's/.* ExitCode=\([^ ]*\).*/\1/p' <<<"$rec")
  [[ $st == COMPLETED && $ec == 0:0 ]] || fail "job $id ($name) ended $st with exit code $ec (its output: $tmp/out/$name.out, below)"
done

out=$tmp/out
for n in main-1 main-2 low-1 low-2; do
  grep -qx "env VRAMSWAP_RUNTIME_DIR=$tmp/vramswap" "$out/$n.out" || fail "job $n has no VRAMSWAP_RUNTIME_DIR=$tmp/vramswap from the TaskProlog"
done
for n in main-1 main-2; do
  ! grep -q '^env VRAMSWAP_OVERSUBSCRIBE=' "$out/$n.out" || fail "job $n (partition main) got VRAMSWAP_OVERSUBSCRIBE from the TaskProlog"
  grep -qx 'mode time-sharing' "$out/$n.out" || fail "job $n (partition main) did not run time-sharing"
  [[ $(grep -c '^turn ' "$out/$n.out") -eq $turns ]] || fail "job $n did not report its $turns turns"
  grep -Eq '^time-sharing .* bytes_in=[1-9]' "$out/$n.out" || fail "job $n never brought memory back in: the two jobs did not swap"
done
for n in low-1 low-2; do
  grep -qx 'env VRAMSWAP_OVERSUBSCRIBE=1' "$out/$n.out" || fail "job $n (partition low) has no VRAMSWAP_OVERSUBSCRIBE=1 from the TaskProlog"
  grep -qx 'mode oversubscribed' "$out/$n.out" || fail "job $n (partition low) did not run oversubscribed"
  grep -Eq '^oversub .* demoted=[1-9]' "$out/$n.out" || fail "job $n: no pool frame of it was taken back by a lock holder"
done
! grep -q '^env VRAMSWAP_' "$out/plain.out" || fail "the job without --gres=vramswap got VRAMSWAP_* settings: $(grep '^env' "$out/plain.out")"

# At the same time: some moment lies inside all four jobs' spans (barrier to end).
read -r latest_start earliest_end < <(cat "$out"/main-*.out "$out"/low-*.out | awk '$1 == "span" {
  if ($2 > s) s = $2; if (e == "" || $3 < e) e = $3 } END { print s, e }')
((latest_start < earliest_end)) || fail "the four jobs did not run at the same time (last start $latest_start ns, first end $earliest_end ns)"
# Turns under the lock: sorted by grant, each begins after the previous one was released.
overlap=$(cat "$out"/main-*.out | awk '$1 == "turn" { print $2, $3 }' | sort -n | awk 'NR > 1 && $1 < prev { print; exit } { prev = $2 }')
[[ -z $overlap ]] || fail "two lock turns overlapped (a turn granted at $overlap ns while another was held)"

echo "jobs: $(for n in main-1 main-2 low-1 low-2; do printf '%s[%s] ' "$n" "$(grep -E '^(time-sharing|oversub) ' "$out/$n.out")"; done)"
echo "overlap of all four jobs: $(((earliest_end - latest_start) / 1000000)) ms; $((2 * turns)) lock turns, none overlapping"
echo "PASS: 4 jobs on one device of node $node: COMPLETED 0:0, every byte verified; VRAMSWAP_OVERSUBSCRIBE=1 only in partition low"
ok=1
