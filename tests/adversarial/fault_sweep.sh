#!/usr/bin/env bash
# fault_sweep.sh TRAIN_GPT MPIEXEC MODE...: the fault hook's sweep (SHARD_FAULT_COLLECTIVE, see
# src/comm/collective_fault.cpp). A train_gpt run on data=2 (2 ranks) of one training step and a
# checkpoint save, with the default settings (no SHARD_* variable), is first counted: how many
# library collectives rank 1 checks (SHARD_FAULT_COLLECTIVE=count). Then for each position k,
# rank 1 diverges there: "extra:k" (it issues one collective more before its k-th: a different
# count) and "rename:k" (its k-th is another collective: a different name or order). Every run
# must end with an error line from both ranks naming the mismatch and a non-zero exit within
# 10 s. SHARD_FULL_MATRIX=1 (CI's slow tier): every k; otherwise a fixed-seed sample of 5
# positions plus the first and the last. Prints the counts (docs/reliability.md lists them).
set -euo pipefail
app=$1 mpiexec=$2
shift 2
modes=("$@")  # extra, rename (ctest runs one test per mode, so the full sweep uses both slots)
work=$(mktemp -d /tmp/shard_fault_sweep.XXXXXX)
trap 'rm -rf "$work"' EXIT
# The default settings: the collective check on, the watcher thread at 600 s.
unset SHARD_CHECK_COLLECTIVES SHARD_COLLECTIVE_TIMEOUT SHARD_ABORT_GRACE SHARD_DEVICES_PER_RANK
args=(--mesh data=2 --layers 1 --d-model 16 --heads 2 --context 8 --batch 4 --steps 1 --warmup 0
      --eval-every 0 --val-windows 4 --seed 3)
launch() {  # launch <setting> <checkpoint dir>: train_gpt at 2 ranks with SHARD_FAULT_COLLECTIVE=<setting>
  SHARD_FAULT_COLLECTIVE=$1 timeout 60 "$mpiexec" -n 2 --oversubscribe -x SHARD_FAULT_COLLECTIVE "$app" "${args[@]}" \
    --checkpoint-dir "$2"
}

launch count "$work/count" > "$work/count.txt" 2>&1 || { cat "$work/count.txt"; echo "fault_sweep: the counting run failed"; exit 1; }
n=$(sed -n 's/.*\[rank 1\] SHARD_FAULT_COLLECTIVE=count: \([0-9]*\) checked collectives.*/\1/p' "$work/count.txt")
n0=$(sed -n 's/.*\[rank 0\] SHARD_FAULT_COLLECTIVE=count: \([0-9]*\) checked collectives.*/\1/p' "$work/count.txt")
if [ -z "$n" ] || [ "$n" != "$n0" ] || [ "$n" -lt 2 ]; then
  cat "$work/count.txt"
  echo "fault_sweep: expected both ranks to count the same collectives (rank 0: '$n0', rank 1: '$n')"
  exit 1
fi

if [ "${SHARD_FULL_MATRIX:-0}" = 1 ]; then
  positions=$(seq 1 "$n")
else
  positions=$(python3 -c "import random; r = random.Random(33); print(*sorted({1, $n, *r.sample(range(2, $n), min(5, $n - 2))}))")
fi

one() {  # one <mode> <k>: a faulted run; prints "ok <seconds>" or "bad <mode>:<k> <why>" and its output
  local mode=$1 k=$2 out="$work/$1-$2.txt" start=$EPOCHREALTIME rc=0 why=""
  launch "$mode:$k:1" "$work/ck-$mode-$k" > "$out" 2>&1 || rc=$?
  local seconds
  seconds=$(python3 -c "print(f'{$EPOCHREALTIME - $start:.1f}')")
  if [ "$rc" = 0 ]; then why="exit 0"
  elif [ "$rc" = 124 ]; then why="no exit within 60 s"
  elif ! grep -q "\[rank 0\] error: .*collective mismatch" "$out"; then why="no mismatch error from rank 0"
  elif ! grep -q "\[rank 1\] error: .*collective mismatch" "$out"; then why="no mismatch error from rank 1"
  elif ! python3 -c "import sys; sys.exit(0 if $seconds < 10 else 1)"; then why="took $seconds s"
  fi
  if [ -z "$why" ]; then
    echo "ok $seconds"
  else
    echo "bad $mode:$k:1 $why"
    tail -20 "$out" | sed 's/^/    /'
  fi
}
export -f one launch
export work app mpiexec
export args_text="${args[*]}"
# 2 runs at once (3 on the full sweep): a run mostly waits for mpiexec to start and end.
jobs=2
[ "${SHARD_FULL_MATRIX:-0}" = 1 ] && jobs=3
# shellcheck disable=SC2016  # the inner bash expands them, with the arguments from xargs
for k in $positions; do for mode in "${modes[@]}"; do echo "$mode $k"; done; done |
  xargs -P "$jobs" -L 1 bash -c 'read -ra args <<< "$args_text"; one "$0" "$1"' > "$work/results.txt"
runs=$(grep -c '^ok\|^bad' "$work/results.txt" || true)
bad=$(grep -c '^bad' "$work/results.txt" || true)
slowest=$(awk '$1 == "ok" && $2 > m { m = $2 } END { print m + 0 }' "$work/results.txt")
grep -v '^ok' "$work/results.txt" || true
echo "fault_sweep: $n checked collectives in a train_gpt run (1 step and a checkpoint save, data=2, 2 ranks);" \
     "$runs faulted runs (${modes[*]} at $(echo "$positions" | wc -w) positions): $((runs - bad)) ended in a" \
     "collective mismatch on both ranks and a non-zero exit within 10 s (slowest $slowest s)"
[ "$bad" = 0 ] && [ "$runs" = $((${#modes[@]} * $(echo "$positions" | wc -w))) ]
