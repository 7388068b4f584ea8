#!/usr/bin/env bash
# kill_train.sh <train_mlp> <mpiexec>, run by ctest (reliability.kill_train):
#   1. a 2-rank train_mlp run writes checkpoints; once one exists, rank 1 is killed with -9;
#   2. mpirun must exit with a non-zero code within 10 s (no rank left waiting forever);
#   3. --resume from the newest checkpoint must finish with exit 0, continuing from its step.
set -euo pipefail
app=$1 mpiexec=$2
work=$(mktemp -d /tmp/shard_kill_train.XXXXXX)
mpirun_pid=
cleanup() {
  if [ -n "$mpirun_pid" ] && kill -0 "$mpirun_pid" 2>/dev/null; then kill -9 "$mpirun_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "kill_train: $*" >&2; [ -f "$work/run1.log" ] && tail -20 "$work/run1.log" >&2; exit 1; }

# The checkpoint directory (unique to this run) marks this run's processes for pgrep.
# shellcheck disable=SC2054  # the commas are inside one argument (--layers 48,64,...)
args=(--dataset synthetic --layers 48,64,32,64,6 --samples 640 --batch 64 --optimizer adam --lr 3e-3 --seed 7
      --checkpoint-dir "$work/ckpt" --checkpoint-every 20 --log-every 10)
"$mpiexec" -n 2 --oversubscribe "$app" "${args[@]}" --epochs 100000 > "$work/run1.log" 2>&1 &
mpirun_pid=$!

# Wait (up to 60 s) for a finished checkpoint: step-<8 digits> appears by rename once complete.
for _ in $(seq 600); do
  compgen -G "$work/ckpt/step-*" > /dev/null && break
  kill -0 "$mpirun_pid" 2>/dev/null || fail "train_mlp ended before writing a checkpoint"
  sleep 0.1
done
compgen -G "$work/ckpt/step-*" > /dev/null || fail "no checkpoint after 60 s"
sleep 1  # let training run on past the checkpoint

victim=
for pid in $(pgrep -f -- "$work/ckpt" || true); do
  [ "$pid" = "$mpirun_pid" ] && continue
  if tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1'; then victim=$pid; fi
done
[ -n "$victim" ] || fail "cannot find the pid of rank 1"
kill -9 "$victim"
echo "killed rank 1 (pid $victim) with -9"
start=$(date +%s.%N)
for _ in $(seq 100); do
  kill -0 "$mpirun_pid" 2>/dev/null || break
  sleep 0.1
done
kill -0 "$mpirun_pid" 2>/dev/null && fail "mpirun still runs 10 s after kill -9 of rank 1"
rc=0
wait "$mpirun_pid" || rc=$?
mpirun_pid=
elapsed=$(echo "$(date +%s.%N) - $start" | bc)
[ "$rc" -ne 0 ] || fail "mpirun exited 0 after rank 1 was killed"
echo "mpirun exited with code $rc ${elapsed} s after the kill"

# The newest checkpoint (the sorted glob ends with it) loads and training continues from it.
steps=("$work"/ckpt/step-*)
last=${steps[-1]}
step=$((10#${last##*step-}))
target=$((step + 30))
echo "resuming from $(basename "$last") (step $step) to step $target"
out=$("$mpiexec" -n 2 --oversubscribe "$app" "${args[@]}" --epochs 100000 --max-steps "$target" --resume 2>&1) ||
  { printf '%s\n' "$out"; fail "--resume failed"; }
printf '%s\n' "$out" | tail -3
grep -q "resumed at step $step" <<<"$out" || fail "the resumed run does not say 'resumed at step $step'"
[ -d "$work/ckpt/$(printf 'step-%08d' "$target")" ] || fail "no checkpoint at step $target after resuming"
echo "kill_train: passed (killed at >= step $step, mpirun ended in ${elapsed} s, resumed to step $target)"
