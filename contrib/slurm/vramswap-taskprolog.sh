#!/bin/sh
# Slurm TaskProlog (slurm.conf: TaskProlog=/path/to/vramswap-taskprolog.sh) that gives the
# tasks of jobs that asked for vramswap the node's vramswap settings.
#
# slurmstepd runs it as the job's user before each task and reads its stdout: a line
# "export NAME=value" sets a variable in the task, "print text" writes text to the task's
# stdout; anything else is ignored. Its environment is the task's (the job's, plus SLURM_*),
# so nothing here is a security boundary: a job can change any of it afterwards.
#
# Opt-in, either of:
#  - GPU shards (--gres=shard:N; a node whose gres.conf has shards of its GPU): slurmd puts
#    SLURM_SHARDS_ON_NODE into the task's environment;
#  - the vramswap count GRES (--gres=vramswap[:N]): Slurm puts no variable for a count GRES
#    into the environment, so the request is read from the job's own record (scontrol show
#    job, one call per task; a user may always see their own job).
#
# Settings: shell assignments in vramswap-slurm.conf next to slurm.conf (the directory of
# $SLURM_CONF, which slurmd sets for every task), all optional:
#   gres=vramswap                 the count GRES whose request opts a job in
#   shards=1                      1: a job given GPU shards (SLURM_SHARDS_ON_NODE) opts in too; 0: not
#   runtime_dir=/run/vramswap     VRAMSWAP_RUNTIME_DIR: one per node, so every job meets the same pool server
#   group=                        VRAMSWAP_GROUP: a group whose members' jobs share the device
#                                 (runtime dir root:<group> 0770); empty: only one user's jobs share it
#   low_partitions=               partitions (space or comma separated) whose jobs get VRAMSWAP_OVERSUBSCRIBE=1
#   low_qos=                      QOS names whose jobs get VRAMSWAP_OVERSUBSCRIBE=1 (QOS needs accounting, slurmdbd)
#   extra=                        more "NAME=value" pairs (space separated) exported to opted-in tasks
gres=vramswap
shards=1
runtime_dir=/run/vramswap
group=
low_partitions=
low_qos=
extra=
conf=${SLURM_CONF:-/etc/slurm/slurm.conf}
conf=${conf%/*}/vramswap-slurm.conf
# shellcheck source=/dev/null
[ -r "$conf" ] && . "$conf"

# Nothing to do outside a job (a TaskProlog always has SLURM_JOB_ID; this guards a hand run).
[ -n "$SLURM_JOB_ID" ] || exit 0

# The job's record, read from slurmctld only when needed (a GRES request, a QOS), once. A job
# with shards needs none: a slurmctld that does not answer must not leave it without its
# settings, in a pool of its own beside the node's.
job=
job_read=0
read_job() {
  [ "$job_read" = 1 ] && return 0
  job=$(scontrol show job -o "$SLURM_JOB_ID" 2>&1) || return 1
  job_read=1
}
asked=0
[ "$shards" = 1 ] && [ "${SLURM_SHARDS_ON_NODE:-0}" -gt 0 ] 2>/dev/null && asked=1
if [ "$asked" = 0 ]; then
  read_job || {
    # Not fatal to the job: it runs without vramswap's node settings, and says why.
    echo "print vramswap TaskProlog: 'scontrol show job $SLURM_JOB_ID' failed on $(hostname): $job; the job's tasks get no vramswap settings (ask the cluster's admins)"
    exit 0
  }
  # TresPerNode=gres:vramswap:1 (or TresPerJob/PerSocket/PerTask): the job asked for the GRES.
  echo "$job" | tr ' ' '\n' | grep -E '^Tres(PerNode|PerJob|PerSocket|PerTask)=' | tr ',' '\n' |
    grep -Eq "(^|=)gres[:/]$gres(:|\$)" && asked=1
fi
[ "$asked" = 1 ] || exit 0

echo "export VRAMSWAP_RUNTIME_DIR=$runtime_dir"
[ -n "$group" ] && echo "export VRAMSWAP_GROUP=$group"
if [ ! -d "$runtime_dir" ]; then
  echo "print vramswap TaskProlog: $runtime_dir (VRAMSWAP_RUNTIME_DIR) does not exist on $(hostname): the first job makes it, for its own user only; the node's admins should create it (docs/deploy.md, Slurm node setup)"
fi

# Low priority: a listed partition (SLURM_JOB_PARTITION is in every task's environment) or
# QOS (not in the environment: read from the job's record; "(null)" without accounting).
low=0
for p in $(echo "$low_partitions" | tr ',' ' '); do
  [ "$p" = "$SLURM_JOB_PARTITION" ] && low=1
done
if [ -n "$low_qos" ]; then
  if read_job; then
    qos=$(echo "$job" | tr ' ' '\n' | sed -n 's/^QOS=//p')
    for q in $(echo "$low_qos" | tr ',' ' '); do
      [ "$q" = "$qos" ] && low=1
    done
  else
    echo "print vramswap TaskProlog: 'scontrol show job $SLURM_JOB_ID' failed on $(hostname): $job; its QOS is unknown, so its tasks run at normal priority"
  fi
fi
[ "$low" = 1 ] && echo "export VRAMSWAP_OVERSUBSCRIBE=1"

for kv in $extra; do
  echo "export $kv"
done
exit 0
