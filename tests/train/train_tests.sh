#!/usr/bin/env bash
# train_mlp tests, run by ctest: train_tests.sh <train_mlp> <mpiexec> <case>
#   meshes   50 steps on data=4; data=2,model=2; data=1,model=4 (2 ranks x 2 devices: gradients
#            over MPI), the first two also with --shard-optimizer-state; data=4 and data=2,model=2
#            on 4 ranks x 1 device (--grad-sync auto: optimizer state split over 'data', each
#            weight gradient one psum_scatter through group-shared memory) and data=4 there with
#            --grad-sync mpi; and 1 device: per-step losses agree to 1e-4 relative; the same run
#            twice gives identical losses (1 device, and 4 ranks through shared memory); layer
#            widths that 4 replicas do not divide, through shared memory, against 1 device
#   resume   2 epochs on data=2,model=2 against 1 epoch on data=4 (2 ranks x 2 devices, optimizer
#            state split over 'data') + --resume on 4 ranks with data=1,model=4, and against 10
#            steps on data=4 through group-shared memory (4 ranks) + --resume on data=2,model=2
#            through group-shared memory: the final checkpoints' .npy files agree
#   resume_other_model   --resume with other --layers fails with a clear message on every rank
#   jit      --jit (value_and_grad and the optimizer's update as one jitted program, parameters and
#            state donated) against the eager step, 2 epochs with the cosine schedule: Adam on data=2
#            (2 ranks), Adam on data=2,model=2 with the optimizer state over 'data' and SGD with
#            momentum on data=1,model=4 (2 ranks x 2 devices), bfloat16 on data=2: per-step losses
#            agree to 1e-5 relative (bfloat16: 1e-3) and the summary says "jit": true
set -euo pipefail
app=$1 mpiexec=$2 case=$3
work=$(mktemp -d /tmp/shard_train_test.XXXXXX)
trap 'rm -rf "$work"' EXIT
python=python3
if [ -x /usr/bin/python3 ] && /usr/bin/python3 -c "import numpy" 2>/dev/null; then python=/usr/bin/python3; fi
compare="$python $(dirname "$0")/compare.py"
run() {  # run <ranks> <devices per rank> <args...>
  local n=$1 k=$2
  shift 2
  "$mpiexec" -n "$n" --oversubscribe "$app" --devices-per-rank "$k" "$@"
}
# With --shard-optimizer-state the last bias (6) splits over data=2 but not data=4: both layouts run.
# shellcheck disable=SC2054  # the commas are inside one argument (--layers 48,64,...), not separators
small=(--dataset synthetic --layers 48,64,32,64,6 --samples 640 --batch 64 --optimizer adam --lr 3e-3 --seed 7)
case $case in
  meshes)
    run 2 2 "${small[@]}" --mesh data=4 --max-steps 50 --json --log-every 1 > "$work/d4.jsonl"
    run 2 2 "${small[@]}" --mesh data=2,model=2 --max-steps 50 --json --log-every 1 > "$work/d2m2.jsonl"
    run 2 2 "${small[@]}" --mesh data=1,model=4 --max-steps 50 --json --log-every 1 > "$work/m4.jsonl"
    run 1 1 "${small[@]}" --max-steps 50 --json --log-every 1 > "$work/one.jsonl"
    run 2 2 "${small[@]}" --mesh data=4 --shard-optimizer-state --max-steps 50 --json --log-every 1 > "$work/d4z.jsonl"
    run 2 2 "${small[@]}" --mesh data=2,model=2 --shard-optimizer-state --max-steps 50 --json --log-every 1 \
      > "$work/d2m2z.jsonl"
    run 1 1 "${small[@]}" --max-steps 50 --json --log-every 1 > "$work/one_again.jsonl"
    run 4 1 "${small[@]}" --mesh data=4 --max-steps 50 --json --log-every 1 > "$work/d4s.jsonl"
    run 4 1 "${small[@]}" --mesh data=4 --max-steps 50 --json --log-every 1 > "$work/d4s_again.jsonl"
    run 4 1 "${small[@]}" --mesh data=2,model=2 --max-steps 50 --json --log-every 1 > "$work/d2m2s.jsonl"
    run 4 1 "${small[@]}" --mesh data=4 --grad-sync mpi --max-steps 50 --json --log-every 1 > "$work/d4mpi.jsonl"
    # each run took the path it names (the summary's grad_sync)
    for f in d4 d2m2 d4z d2m2z d4mpi; do grep -q '"grad_sync": "mpi"' "$work/$f.jsonl" || { echo "$f: not over MPI"; exit 1; }; done
    for f in d4s d2m2s; do
      grep -q '"grad_sync": "shared-memory"' "$work/$f.jsonl" || { echo "$f: not through shared memory"; exit 1; }
    done
    $compare losses 1e-4 "$work/one.jsonl" "$work/d4.jsonl" "$work/d2m2.jsonl" "$work/m4.jsonl" "$work/d4z.jsonl" \
      "$work/d2m2z.jsonl" "$work/d4s.jsonl" "$work/d2m2s.jsonl" "$work/d4mpi.jsonl"
    $compare identical "$work/one.jsonl" "$work/one_again.jsonl"
    $compare identical "$work/d4s.jsonl" "$work/d4s_again.jsonl"
    # widths that 4 replicas do not divide (66, 30): those arrays' optimizer state stays whole
    # shellcheck disable=SC2054  # the commas are inside one argument (--layers 48,66,30,6)
    odd=(--dataset synthetic --layers 48,66,30,6 --samples 640 --batch 64 --optimizer sgd --lr 3e-3 --seed 3)
    run 1 1 "${odd[@]}" --max-steps 30 --json --log-every 1 > "$work/odd_one.jsonl"
    run 4 1 "${odd[@]}" --mesh data=4 --max-steps 30 --json --log-every 1 > "$work/odd_d4a.jsonl"
    grep -q '"grad_sync": "shared-memory"' "$work/odd_d4a.jsonl" || { echo "odd_d4a: not through shared memory"; exit 1; }
    $compare losses 1e-4 "$work/odd_one.jsonl" "$work/odd_d4a.jsonl"
    # and the losses really fall (the comparison is not between runs that learn nothing)
    $python - "$work/one.jsonl" <<'PY'
import json, sys
l = [json.loads(x)["loss"] for x in open(sys.argv[1]) if '"loss"' in x]
assert l[-1] < 0.7 * l[0], f"loss did not fall: {l[0]} -> {l[-1]}"
print(f"loss {l[0]:.4f} -> {l[-1]:.4f}")
PY
    ;;
  resume)
    run 2 2 "${small[@]}" --mesh data=2,model=2 --epochs 2 --checkpoint-dir "$work/a" --json > "$work/a.jsonl"
    run 2 2 "${small[@]}" --mesh data=4 --shard-optimizer-state --epochs 2 --max-steps 10 --checkpoint-dir "$work/b" \
      --json > "$work/b1.jsonl"
    run 4 1 "${small[@]}" --mesh data=1,model=4 --epochs 2 --checkpoint-dir "$work/b" --resume --json > "$work/b2.jsonl"
    # step-<8 digits>: the sorted glob ends with the newest checkpoint
    steps_a=("$work"/a/step-*) steps_b=("$work"/b/step-*)
    a=${steps_a[-1]} b=${steps_b[-1]}
    if [ ! -d "$a" ] || [ ! -d "$b" ]; then echo "no checkpoints in $work/a or $work/b"; exit 1; fi
    [ "$(basename "$a")" = "$(basename "$b")" ] || { echo "final steps differ: $a vs $b"; exit 1; }
    $compare npy 1e-4 "$a" "$b"
    # through group-shared memory (optimizer state split over 'data'): written from it, resumed into it
    run 4 1 "${small[@]}" --mesh data=4 --epochs 2 --max-steps 10 --checkpoint-dir "$work/c" --json > "$work/c1.jsonl"
    run 4 1 "${small[@]}" --mesh data=2,model=2 --epochs 2 --checkpoint-dir "$work/c" --resume --json > "$work/c2.jsonl"
    grep -q '"grad_sync": "shared-memory"' "$work/c2.jsonl" || { echo "c2: not through shared memory"; exit 1; }
    steps_c=("$work"/c/step-*)
    c=${steps_c[-1]}
    [ "$(basename "$a")" = "$(basename "$c")" ] || { echo "final steps differ: $a vs $c"; exit 1; }
    $compare npy 1e-4 "$a" "$c"
    ;;
  resume_other_model)  # a checkpoint of another model shape: a clear error on every rank
    run 2 1 --dataset synthetic --layers 16,8,4 --samples 64 --batch 16 --epochs 1 --checkpoint-dir "$work/c" > /dev/null
    "$(dirname "$0")/../expect_failure.sh" \
      "rank 1\] error: --resume: .* holds a model with layers 16,8,4, this run has --layers 16,12,4" \
      "$mpiexec" -n 2 --oversubscribe "$app" --dataset synthetic --layers 16,12,4 --samples 64 --batch 16 --epochs 2 \
      --checkpoint-dir "$work/c" --resume
    ;;
  jit)
    # shellcheck disable=SC2054  # the commas are inside one argument (--layers 48,64,...)
    sgd=(--dataset synthetic --layers 48,64,32,64,6 --samples 640 --batch 64 --optimizer sgd --lr 3e-3 --seed 7)
    for args in "2 1 --mesh data=2" "2 2 --mesh data=2,model=2 --shard-optimizer-state" "2 2 --mesh data=1,model=4 sgd" \
                "2 1 --mesh data=2 --dtype bfloat16"; do
      read -ra a <<< "$args"
      flags=("${small[@]}")
      [ "${a[-1]}" = sgd ] && { flags=("${sgd[@]}"); unset 'a[-1]'; }
      run "${a[0]}" "${a[1]}" "${flags[@]}" "${a[@]:2}" --epochs 2 --lr-schedule cosine --json --log-every 1 \
        > "$work/eager.jsonl"
      run "${a[0]}" "${a[1]}" "${flags[@]}" "${a[@]:2}" --epochs 2 --lr-schedule cosine --json --log-every 1 --jit \
        > "$work/jit.jsonl"
      grep -q '"jit": true' "$work/jit.jsonl" || { echo "$args: the --jit run's summary does not say jit"; exit 1; }
      tol=1e-5
      [[ "$args" == *bfloat16* ]] && tol=1e-3
      $compare losses "$tol" "$work/eager.jsonl" "$work/jit.jsonl"
    done
    ;;
  fsdp)
    # --fsdp (parameters and state split over 'data', gathered where used; under --jit each gather
    # starts one layer ahead): the replicated run's losses, eager and jitted.
    for args in "2 1 --mesh data=2" "2 2 --mesh data=2,model=2"; do
      read -ra a <<< "$args"
      run "${a[0]}" "${a[1]}" "${small[@]}" "${a[@]:2}" --epochs 2 --json --log-every 1 --grad-sync mpi \
        > "$work/replicated.jsonl"
      for mode in "" --jit; do
        # shellcheck disable=SC2086  # $mode is empty or one flag
        run "${a[0]}" "${a[1]}" "${small[@]}" "${a[@]:2}" --epochs 2 --json --log-every 1 --fsdp $mode \
          > "$work/fsdp.jsonl"
        grep -q '"fsdp": true' "$work/fsdp.jsonl" || { echo "$args $mode: the summary does not say fsdp"; exit 1; }
        $compare losses 1e-5 "$work/replicated.jsonl" "$work/fsdp.jsonl"
      done
    done
    ;;
  *) echo "unknown case $case"; exit 2 ;;
esac
