#!/bin/bash
# Runs deploy/slurm/fsdp-train.sbatch for real on a one-node Slurm cluster
# started here (Debian's slurm-wlm and munge; everything in a temp directory,
# private ports, no accounting, no cgroups).
#
#   test_slurm_sbatch.sh FSDP_TRAIN SOURCE_DIR
#
# 1. Training: sbatch with 2 tasks on one node runs fsdp-train on CPU (tiny
#    model, the repository's small corpus, 4 steps). Passes when the job ends
#    COMPLETED with exit code 0, rank 0 printed one "Batch N Loss: X, Speed: Y
#    samples/sec, lr: Z" line per step, no other rank printed any, and the
#    trainer saw 2 ranks launched by Slurm.
# 2. Time limit: a stand-in trainer (a script that waits for SIGTERM, then
#    "saves" for 2 s and exits 0) runs under the sbatch script; the test sends
#    SIGUSR1 to the batch script only, as --signal=B:USR1@120 does. Passes when
#    every task got exactly one SIGTERM, the script requeued the job, the second
#    run started with SLURM_RESTART_COUNT=1 and --resume on the same checkpoint
#    directory, and the job ended COMPLETED.
# 3. Preemption: SIGTERM to the tasks, as Slurm sends it within GraceTime, and
#    to the batch script. Passes when every task got exactly one SIGTERM
#    (fsdp-train dies on a second), the script kept waiting for them, and the
#    job ended COMPLETED without a requeue by the script.
# 4. With an fsdp-train that has --checkpoint-dir: the real trainer, 60 steps,
#    time-limit warning after step 5. Passes when the first run stopped early,
#    the job was requeued, the second run continued right after the first
#    run's last step (from its checkpoint, not from step 0), every step was
#    logged exactly once over both runs, and the job ended COMPLETED.
#
# Exit 0 pass, 1 fail, 77 skip (only when Slurm cannot start here: not root,
# packages missing, fewer than 2 CPUs, or the daemons do not come up — the
# reason is printed). Bounded by DEADLINE; daemons and jobs are stopped and
# the temp directory removed on every exit (FSDP_KEEP_TEST_DIR=1 keeps it).
set -uo pipefail

if (($# != 2)); then
  echo "usage: $0 FSDP_TRAIN SOURCE_DIR" >&2
  exit 2
fi
FSDP_TRAIN=$(realpath "$1")
SRC=$(realpath "$2")
SBATCH_SCRIPT=$SRC/deploy/slurm/fsdp-train.sbatch
CORPUS=$SRC/data/fallback_corpus.jsonl
STEPS=4
DEADLINE=$((SECONDS + 240))
# Daemons die on their own after this even if the test is killed outright.
LIFETIME=290

skip() {
  echo "SKIP: $*"
  exit 77
}

[[ -x "$FSDP_TRAIN" ]] || { echo "FAIL: fsdp-train not found at $FSDP_TRAIN"; exit 1; }
[[ -f "$SBATCH_SCRIPT" && -f "$CORPUS" ]] || { echo "FAIL: $SBATCH_SCRIPT or $CORPUS missing"; exit 1; }
[[ $(id -u) -eq 0 ]] || skip "needs root: this private Slurm runs slurmctld and slurmd with SlurmUser=root"
for c in munged munge slurmctld slurmd sbatch squeue scontrol scancel sinfo python3; do
  command -v "$c" >/dev/null 2>&1 ||
    skip "'$c' not found — install Debian's slurm-wlm and munge (scripts/deps.sh installs them)"
done
(($(nproc) >= 2)) || skip "needs 2 CPUs for 2 Slurm tasks, this machine has $(nproc)"

T=$(mktemp -d "${TMPDIR:-/tmp}/fsdp-slurm.XXXXXX")
chmod 755 "$T"
mkdir -p "$T/munge" "$T/state" "$T/spool" "$T/log" "$T/jobs"
export SLURM_CONF=$T/slurm.conf
PIDS=()  # daemons started here (their `timeout` wrappers), in start order

dump_logs() {
  local f
  for f in "$T"/log/*.log "$T"/log/*.out "$T"/jobs/*.out; do
    [[ -s "$f" ]] || continue
    echo "----- ${f#"$T"/} (last 40 lines)"
    tail -n 40 "$f"
  done
}

# Processes this test started: the daemons (by PID) and anything carrying this
# run's tag in its environment (jobs' tasks and slurmstepd, which slurmd and
# sbatch start on our behalf).
tagged_pids() {
  local p
  for p in /proc/[0-9]*; do
    [[ "${p#/proc/}" == "$$" ]] && continue
    tr '\0' '\n' 2>/dev/null <"$p/environ" | grep -qxF "FSDP_SLURM_TEST_TAG=$T" && echo "${p#/proc/}"
  done
}

cleanup() {
  local rc=$? p i
  trap - EXIT INT TERM
  if [[ -S "$T/munge/munge.socket.2" ]] && ((${#PIDS[@]} > 1)); then
    timeout 10 scancel --quiet --user=root 2>/dev/null
    for ((i = 0; i < 50; i++)); do
      [[ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ]] && break
      sleep 0.2
    done
  fi
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do kill -TERM "${PIDS[i]}" 2>/dev/null; done
  for p in "${PIDS[@]}"; do
    for ((i = 0; i < 50; i++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null && echo "cleanup: daemon $p did not stop on SIGTERM, killed"
    wait "$p" 2>/dev/null
  done
  for p in $(tagged_pids); do
    echo "cleanup: killing leftover process $p ($(tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | cut -c1-80))"
    kill -KILL "$p" 2>/dev/null
  done
  if ((rc != 0 && rc != 77)); then dump_logs; fi
  if [[ "${FSDP_KEEP_TEST_DIR:-0}" == 1 ]]; then
    echo "kept $T"
  else
    rm -rf "$T"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'echo "FAIL: interrupted"; exit 1' INT TERM

fail() {
  echo "FAIL: $*"
  exit 1
}
remaining() { echo $((DEADLINE - SECONDS)); }

# ---- munge ------------------------------------------------------------------
MUNGE_SOCKET=$T/munge/munge.socket.2
if command -v mungekey >/dev/null 2>&1; then
  mungekey --create --keyfile="$T/munge/munge.key" >/dev/null 2>&1
else
  head -c 1024 /dev/urandom >"$T/munge/munge.key"
fi
chmod 600 "$T/munge/munge.key"
timeout -k 5 "$LIFETIME" env FSDP_SLURM_TEST_TAG="$T" munged --foreground --force --socket="$MUNGE_SOCKET" \
  --key-file="$T/munge/munge.key" --pid-file="$T/munge/munged.pid" --seed-file="$T/munge/seed" \
  --log-file="$T/log/munged.log" >"$T/log/munged.out" 2>&1 &
PIDS+=($!)
for ((i = 0; i < 50; i++)); do
  [[ -S "$MUNGE_SOCKET" ]] && munge -S "$MUNGE_SOCKET" -n 2>/dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1 && break
  sleep 0.1
done
((i < 50)) || { dump_logs; skip "munged did not come up (log above)"; }

# ---- slurm.conf -------------------------------------------------------------
read -r CTLD_PORT SLURMD_PORT MASTER_PORT < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')
HOST=$(hostname -s)
# One node named localhost (so the job's node list, and MASTER_ADDR taken from
# it, resolve everywhere) on this host. cred_expire is also how long a
# requeued job waits before it may start again (default 120 s).
cat >"$SLURM_CONF" <<EOF
ClusterName=fsdptest
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=5
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
PlugStackConfig=/dev/null
ReturnToService=2
MinJobAge=600
NodeName=localhost NodeHostname=$HOST NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF

timeout -k 5 "$LIFETIME" env FSDP_SLURM_TEST_TAG="$T" slurmctld -D -f "$SLURM_CONF" >"$T/log/slurmctld.out" 2>&1 &
PIDS+=($!)
# slurmd 22.05 cannot start without the machine's cgroup file systems (even with
# proctrack/linuxproc and task/none). Where /sys/fs/cgroup shows none (a chroot or container that
# bound /sys without its submounts), slurmd runs in a mount namespace of its own where the
# hierarchies this process belongs to (/proc/self/cgroup) are mounted as the machine has them:
# one cgroup2 file system, or a tmpfs with one directory per cgroup v1 hierarchy. /sys is made
# private in that namespace first, so nothing propagates back out.
slurmd_cmd=(slurmd -D -N localhost -f "$SLURM_CONF")
if [[ "$(stat -fc %T /sys/fs/cgroup 2>/dev/null)" == sysfs ]]; then
  command -v unshare >/dev/null || skip "/sys/fs/cgroup has no file system mounted and unshare is missing"
  mount_cgroups='mount --make-rprivate /sys || exit 1
    if grep -q "^0::" /proc/self/cgroup && [ "$(wc -l < /proc/self/cgroup)" -eq 1 ]; then
      mount -t cgroup2 none /sys/fs/cgroup || exit 1
    else
      mount -t tmpfs cgroup-root /sys/fs/cgroup || exit 1
      for c in $(cut -d: -f2 /proc/self/cgroup); do
        [ -n "$c" ] || continue
        d=${c#name=}; opts=$c; [ "$d" != "$c" ] && opts="none,$c"
        mkdir -p "/sys/fs/cgroup/$d" && mount -t cgroup -o "$opts" cgroup "/sys/fs/cgroup/$d" || exit 1
      done
    fi
    exec "$@"'
  slurmd_cmd=(unshare --mount --propagation unchanged sh -c "$mount_cgroups" slurmd-in-namespace "${slurmd_cmd[@]}")
  echo "slurm: /sys/fs/cgroup has no file system mounted here; slurmd mounts this machine's cgroup hierarchies" \
       "in a mount namespace of its own"
fi
timeout -k 5 "$LIFETIME" env FSDP_SLURM_TEST_TAG="$T" "${slurmd_cmd[@]}" >"$T/log/slurmd.out" 2>&1 &
PIDS+=($!)
state=""
for ((i = 0; i < 150; i++)); do
  state=$(timeout 5 sinfo -h -n localhost -o %T 2>/dev/null)
  [[ "$state" == idle ]] && break
  for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null || break 2; done
  sleep 0.2
done
[[ "$state" == idle ]] || { dump_logs; skip "slurmctld/slurmd did not come up (node state '$state'; logs above)"; }
echo "slurm: $(sinfo --version) up on $HOST, slurmctld :$CTLD_PORT, slurmd :$SLURMD_PORT"

# Prints the job's final state once it has one, or TIMEOUT_WAITING.
wait_done() {
  local id=$1 limit=$2 st=""
  local end=$((SECONDS + limit))
  while ((SECONDS < end && SECONDS < DEADLINE)); do
    st=$(timeout 5 scontrol show job "$id" -o 2>/dev/null | grep -o 'JobState=[A-Z_]*')
    st=${st#JobState=}
    case "$st" in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE | PREEMPTED)
        echo "$st"
        return
        ;;
    esac
    sleep 0.25
  done
  echo "TIMEOUT_WAITING($st)"
}
job_field() { timeout 5 scontrol show job "$1" -o | tr ' ' '\n' | grep "^$2=" | cut -d= -f2-; }

submit() {  # submit NAME [VAR=VALUE...] — prints the job id
  local name=$1
  shift
  env "$@" timeout 30 sbatch --parsable --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --time=5 \
    --job-name="$name" --chdir="$T/jobs" --output="$T/jobs/%x-%j.out" \
    --export=ALL,FSDP_SLURM_TEST_TAG="$T" "$SBATCH_SCRIPT"
}

# ---- 1. real training -------------------------------------------------------
help_text=$("$FSDP_TRAIN" --help 2>/dev/null)
if [[ "$help_text" == *--checkpoint-dir* ]]; then
  CKPT_A=$T/ckpt-train
else
  CKPT_A=none
  echo "note: this fsdp-train has no --checkpoint-dir yet; job 1 runs with CHECKPOINT_DIR=none"
fi
id=$(submit fsdp-train-test FSDP_TRAIN="$FSDP_TRAIN" DEVICE=cpu MODEL=tiny DATA="$CORPUS" \
  CHECKPOINT_DIR="$CKPT_A" MASTER_PORT="$MASTER_PORT" \
  TRAIN_ARGS="--max-steps $STEPS --seq-len 64 --batch-size 2 --log-every 1") || fail "sbatch refused the training job"
echo "job $id: fsdp-train, 2 tasks, $STEPS steps"
st=$(wait_done "$id" 150)
out=$T/jobs/fsdp-train-test-$id.out
[[ "$st" == COMPLETED ]] || fail "training job $id ended $st (expected COMPLETED)"
[[ "$(job_field "$id" ExitCode)" == 0:0 ]] || fail "training job $id exit code $(job_field "$id" ExitCode)"
batch_re='^0: .*\[fsdp-train\] Batch [0-9]+ Loss: [0-9]+\.[0-9]+, Speed: [0-9]+\.[0-9]+ samples/sec, lr: [0-9]+\.[0-9]+ \| step [0-9]+/[0-9]+, [0-9]+ tokens/s, grad norm [^ ]+, peak mem .+, ETA [^ ]+$'
grep -E "$batch_re" "$out"
n=$(grep -cE "$batch_re" "$out")
((n == STEPS)) || fail "expected $STEPS 'Batch N Loss:' lines from rank 0 in $out, found $n"
for ((s = 0; s < STEPS; s++)); do
  grep -qE "^0: .*\] Batch $s Loss: " "$out" || fail "no 'Batch $s Loss:' line from rank 0"
done
! grep -qE '^[1-9][0-9]*: .*Batch [0-9]+ Loss:' "$out" || fail "a rank other than 0 printed Batch lines"
grep -qE '^0: .*, 2 ranks \(slurm\),' "$out" || fail "fsdp-train did not report 2 ranks launched by Slurm"
grep -q "rendezvous localhost:$MASTER_PORT" "$out" || fail "sbatch script did not set MASTER_ADDR=localhost MASTER_PORT=$MASTER_PORT"
if [[ "$CKPT_A" != none ]]; then
  [[ -n "$(ls -A "$CKPT_A" 2>/dev/null)" ]] || fail "checkpoint directory $CKPT_A is empty after the job"
fi
echo "job $id: COMPLETED, exit 0:0, $n Batch lines from rank 0"

# ---- stand-in trainer for the signal paths -----------------------------------
cat >"$T/stand-in-trainer.sh" <<'STANDIN'
#!/bin/bash
# Stands in for fsdp-train: on SIGTERM "saves a checkpoint" for 2 s (long
# enough to notice a second SIGTERM, which would kill the real trainer) and
# exits 0; a requeued run (SLURM_RESTART_COUNT > 0) "resumes" and finishes.
r=$SLURM_PROCID
echo "stand-in rank $r restart ${SLURM_RESTART_COUNT:-0} args: $*"
if ((${SLURM_RESTART_COUNT:-0} > 0)); then
  echo "stand-in rank $r: resumed and finished"
  exit 0
fi
n=0
trap 'n=$((n + 1))' TERM
echo "stand-in rank $r: training"
for ((i = 0; i < 600 && n == 0; i++)); do sleep 0.1; done
((n > 0)) || { echo "stand-in rank $r: no SIGTERM within 60 s"; exit 1; }
for ((i = 0; i < 20; i++)); do sleep 0.1; done
echo "stand-in rank $r: checkpoint saved after $n SIGTERM(s)"
exit 0
STANDIN
chmod 755 "$T/stand-in-trainer.sh"

wait_training() {  # wait_training OUT N: until N tasks print ": training"
  local started i
  for ((i = 0; i < 300; i++)); do
    started=$(grep -c ': training$' "$1" 2>/dev/null)
    ((${started:-0} >= $2)) && return 0
    sleep 0.1
  done
  return 1
}

# ---- 2. time-limit warning -> one SIGTERM per task, checkpoint, requeue, resume
CKPT_B=$T/ckpt-requeue
id=$(submit fsdp-requeue-test FSDP_TRAIN="$T/stand-in-trainer.sh" DEVICE=cpu MODEL=tiny \
  CHECKPOINT_DIR="$CKPT_B") || fail "sbatch refused the requeue job"
out=$T/jobs/fsdp-requeue-test-$id.out
echo "job $id: stand-in trainer; SIGUSR1 to the batch script as --signal=B:USR1@120 sends it"
wait_training "$out" 2 || fail "the stand-in trainer's 2 tasks did not start"
timeout 10 scancel --batch --signal=USR1 "$id" || fail "scancel --batch --signal=USR1 $id failed"
st=$(wait_done "$id" 90)
[[ "$st" == COMPLETED ]] || fail "requeue job $id ended $st (expected COMPLETED after one requeue)"
[[ "$(job_field "$id" Restarts)" == 1 ]] || fail "job $id restarted $(job_field "$id" Restarts) times, expected 1"
for fixed in \
  'fsdp-train.sbatch: time limit near (SIGUSR1): asking every task to checkpoint and exit' \
  '0: stand-in rank 0: checkpoint saved after 1 SIGTERM(s)' \
  '1: stand-in rank 1: checkpoint saved after 1 SIGTERM(s)' \
  "requeueing job $id to resume from $CKPT_B" \
  "fsdp-train.sbatch: job $id (restart 1)" \
  '0: stand-in rank 0: resumed and finished' \
  '1: stand-in rank 1: resumed and finished'; do
  grep -qF -- "$fixed" "$out" || fail "job $id output lacks: $fixed"
done
for r in 0 1; do
  grep -qE "^$r: stand-in rank $r restart 1 args: .*--checkpoint-dir $CKPT_B .*--resume" "$out" ||
    fail "rank $r of the requeued run did not get --checkpoint-dir $CKPT_B ... --resume"
done
grep -E 'fsdp-train.sbatch: (job|time limit|stopped)|checkpoint saved|resumed' "$out"
echo "job $id: each task got one SIGTERM, job requeued and resumed, COMPLETED (Restarts=1)"

# ---- 3. preemption: Slurm's own SIGTERM to the tasks, and no second one ----
id=$(submit fsdp-preempt-test FSDP_TRAIN="$T/stand-in-trainer.sh" DEVICE=cpu MODEL=tiny \
  CHECKPOINT_DIR="$T/ckpt-preempt") || fail "sbatch refused the preemption job"
out=$T/jobs/fsdp-preempt-test-$id.out
echo "job $id: stand-in trainer; SIGTERM to the tasks (as preemption sends it) and to the batch script"
wait_training "$out" 2 || fail "the stand-in trainer's 2 tasks did not start"
timeout 10 scancel --signal=TERM "$id" || fail "scancel --signal=TERM $id failed"
timeout 10 scancel --batch --signal=TERM "$id" || fail "scancel --batch --signal=TERM $id failed"
st=$(wait_done "$id" 60)
[[ "$st" == COMPLETED ]] || fail "preempted job $id ended $st (expected COMPLETED: the tasks saved and exited 0)"
[[ "$(job_field "$id" Restarts)" == 0 ]] || fail "the script requeued job $id after a plain SIGTERM"
grep -qF 'fsdp-train.sbatch: SIGTERM (preemption): waiting for the tasks to checkpoint and exit' "$out" ||
  fail "job $id: the script did not report the SIGTERM"
for r in 0 1; do
  grep -qF "$r: stand-in rank $r: checkpoint saved after 1 SIGTERM(s)" "$out" ||
    fail "job $id: rank $r did not get exactly one SIGTERM: $(grep -F "stand-in rank $r:" "$out" | tail -n 1)"
done
grep -E 'fsdp-train.sbatch: SIGTERM|checkpoint saved' "$out"
echo "job $id: each task got exactly one SIGTERM, saved, job COMPLETED without a requeue"

# ---- 4. the real trainer through a time limit: save, requeue, resume ---------
if [[ "$CKPT_A" != none ]]; then
  RSTEPS=60
  CKPT_D=$T/ckpt-resume
  id=$(submit fsdp-resume-test FSDP_TRAIN="$FSDP_TRAIN" DEVICE=cpu MODEL=tiny DATA="$CORPUS" \
    CHECKPOINT_DIR="$CKPT_D" CHECKPOINT_EVERY=0 MASTER_PORT="$MASTER_PORT" \
    TRAIN_ARGS="--max-steps $RSTEPS --seq-len 64 --batch-size 2 --log-every 1") || fail "sbatch refused the resume job"
  out=$T/jobs/fsdp-resume-test-$id.out
  echo "job $id: fsdp-train, $RSTEPS steps; time-limit warning after step 5"
  for ((i = 0; i < 600; i++)); do
    grep -qE '^0: .*\] Batch 5 Loss: ' "$out" 2>/dev/null && break
    sleep 0.1
  done
  ((i < 600)) || fail "job $id: no Batch 5 line within 60 s"
  timeout 10 scancel --batch --signal=USR1 "$id" || fail "scancel --batch --signal=USR1 $id failed"
  st=$(wait_done "$id" 120)
  [[ "$st" == COMPLETED ]] || fail "resume job $id ended $st (expected COMPLETED after one requeue)"
  [[ "$(job_field "$id" Restarts)" == 1 ]] || fail "job $id restarted $(job_field "$id" Restarts) times, expected 1"
  # Split the output at the requeued run's banner: the first run must stop early,
  # the second continue right after its last step (not from step 0), and every
  # step must be logged exactly once over both.
  split=$(grep -n "fsdp-train.sbatch: job $id (restart 1)" "$out" | head -n 1 | cut -d: -f1)
  [[ -n "$split" ]] || fail "job $id: no second run in the output"
  first=$(head -n "$split" "$out" | grep -oE '^0: .*\] Batch [0-9]+ Loss: ' | grep -oE '[0-9]+ Loss' | tail -n 1)
  second=$(tail -n +"$split" "$out" | grep -oE '^0: .*\] Batch [0-9]+ Loss: ' | grep -oE '[0-9]+ Loss' | head -n 1)
  stopped=$((${first% Loss} + 1))
  resumed=${second% Loss}
  ((stopped > 5 && stopped < RSTEPS)) || fail "job $id: the first run ended after step $stopped, expected a stop within (5, $RSTEPS)"
  ((resumed == stopped)) || fail "job $id: the requeued run started at step $resumed, expected $stopped (resume from the checkpoint)"
  n=$(grep -cE '^0: .*\] Batch [0-9]+ Loss: ' "$out")
  ((n == RSTEPS)) || fail "job $id: $n Batch lines over both runs, expected $RSTEPS (each step once)"
  grep -qE "^0: .*\] Batch $((RSTEPS - 1)) Loss: " "$out" || fail "job $id: no Batch $((RSTEPS - 1)) line"
  grep -E 'fsdp-train.sbatch: (job|time limit|stopped)|stopped|Resumed|Saved' "$out"
  grep -E "^0: .*\] Batch ($((stopped - 1))|$stopped|$((RSTEPS - 1))) Loss: " "$out"
  echo "job $id: stopped after $stopped steps, requeued, resumed at step $stopped, finished $RSTEPS steps"
else
  echo "note: job 4 (real trainer through a time limit) needs fsdp-train with --checkpoint-dir; not run"
fi

echo "PASS: Slurm sbatch: training, time-limit requeue, preemption ($((SECONDS))s)"
