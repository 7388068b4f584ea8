#!/usr/bin/env bash
# train_cases.sh CASE TRAIN_MLP MPIEXEC...: one adversarial input to train_mlp at the ranks the
# MPIEXEC command line gives (tests/adversarial.cmake checks the message, the non-zero exit and
# the time through expect_failure.sh and the test's TIMEOUT).
#   test_shape    a test set of 28x29 images (812 features) against the 784-input model
#   test_empty    a test set with no images
#   manifest_step a checkpoint whose manifest says optimizer_step "abc", resumed
#   diverge       SGD at lr 1e18: the loss is infinite at step 2; the checkpoint of step 1 stays
#   gpt_small_validation  train_gpt on a corpus whose validation split holds less than a batch of
#                 windows: refused before the first step (it used to train, then fail at the end)
set -euo pipefail
case_name=$1 app=$2
shift 2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck disable=SC2054  # the commas are inside one argument (--layers 784,16,10)
tiny=(--layers 784,16,10 --batch 32 --epochs 1)
case $case_name in
  test_shape)
    python3 "$here/make_idx.py" "$work" 64 16 28 29
    "$@" "$app" --data-dir "$work" "${tiny[@]}" ;;
  test_empty)
    python3 "$here/make_idx.py" "$work" 64 0 28 28
    "$@" "$app" --data-dir "$work" "${tiny[@]}" ;;
  manifest_step)
    python3 "$here/make_idx.py" "$work" 64 16 28 28
    "$@" "$app" --data-dir "$work" "${tiny[@]}" --checkpoint-dir "$work/ck" > /dev/null
    manifest=$(ls "$work"/ck/step-*/manifest.json)
    sed -i 's/"optimizer_step": "[0-9]*"/"optimizer_step": "abc"/' "$manifest"
    grep -q '"optimizer_step": "abc"' "$manifest"
    "$@" "$app" --data-dir "$work" --layers 784,16,10 --batch 32 --epochs 2 --checkpoint-dir "$work/ck" --resume ;;
  diverge)
    rc=0
    "$@" "$app" --dataset synthetic --layers 16,32,4 --samples 256 --batch 32 --epochs 3 --optimizer sgd --lr 1e18 \
      --checkpoint-every 1 --checkpoint-dir "$work/ck" || rc=$?
    # The newest checkpoint kept is step 1's, written before the loss became infinite.
    ls "$work/ck"
    if [ "$(ls "$work/ck")" != step-00000001 ]; then
      echo "train_cases: expected only step-00000001 in $work/ck"
      exit 0  # a zero exit fails expect_failure.sh
    fi
    exit "$rc" ;;
  gpt_small_validation)
    mkdir "$work/corpus"
    python3 -c "
import random
r = random.Random(1)
print('\\n%\\n'.join(''.join(chr(r.randrange(32, 127)) for _ in range(r.randrange(1, 30))) for _ in range(40)))" \
      > "$work/corpus/fortunes"
    rc=0
    "$@" "$app" --data-dir "$work/corpus" --layers 1 --d-model 16 --heads 2 --context 64 --batch 4 --steps 2 \
      --warmup 0 --eval-every 0 > "$work/out.txt" 2>&1 || rc=$?
    cat "$work/out.txt"
    if grep -q "loss" "$work/out.txt"; then
      echo "train_cases: train_gpt trained before refusing the validation split"
      exit 0  # a zero exit fails expect_failure.sh
    fi
    exit "$rc" ;;
  *) echo "train_cases.sh: unknown case $case_name" >&2; exit 2 ;;
esac
