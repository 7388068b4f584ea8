#!/usr/bin/env bash
# train_gpt's tools for scale against the plain step, measured side by side in one run:
#   a) the plain step (the batch in one value_and_grad, every activation kept);
#   b) --remat blocks (each half block run again in the backward pass, only its input kept);
#   c) --remat dots (the products' outputs kept too);
#   d) --micro-batches 4 (the batch in 4 parts, gradients accumulated, one update).
# With --repeats N (default 2) the runs go a b c d a b c d ... (this VM's speed drifts over
# minutes) and each configuration's fastest run counts. Prints a markdown table: tokens/s after
# the first step and its ratio to a), the step's peak array bytes above the parameters and AdamW
# state (the library's live-bytes counter, rank 0) and its ratio to a), the final loss (all equal
# to float rounding), and the SGEMM rate each run measured at start-up (the machine's ceiling).
#   ./benchmarks/gpt_scale.sh [build dir] [--ranks 2] [--steps 8] [--repeats 2] [-- train_gpt flags]
# The model is train_gpt's default (4 layers, d_model 192, context 128, batch 32).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=build/release
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then build=$1; shift; fi
ranks=2 steps=8 repeats=2
extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --ranks) ranks=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,14p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "gpt_scale: unknown flag $1 (--help)" >&2; exit 2 ;;
  esac
done
app=$build/apps/train_gpt
[ -x "$app" ] || { echo "gpt_scale: no $app (build it first)" >&2; exit 1; }
# shellcheck source=../cmake/mpi-env.sh
source cmake/mpi-env.sh
out=$(mktemp -d "${TMPDIR:-/tmp}/gpt_scale.XXXXXX")
trap 'rm -rf "$out"' EXIT

names=(plain remat_blocks remat_dots micro_batches_4)
flags=("" "--remat blocks" "--remat dots" "--micro-batches 4")
for ((r = 0; r < repeats; ++r)); do
  for i in "${!names[@]}"; do
    # shellcheck disable=SC2086  # the configuration's flags split into words
    OPENBLAS_NUM_THREADS=1 mpirun -n "$ranks" --bind-to core "$app" --mesh "data=$ranks" --steps "$steps" \
      --warmup 1 --eval-every 0 --val-windows 32 --json --log-every 0 ${flags[$i]} "${extra[@]}" \
      > "$out/${names[$i]}.$r.jsonl"
  done
done

python3 - "$out" "$repeats" "${names[@]}" <<'EOF'
import json, sys
out, repeats, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
best = {}
for n in names:
    for r in range(repeats):
        s = [json.loads(l) for l in open(f"{out}/{n}.{r}.jsonl") if '"summary"' in l][0]
        if n not in best or s["tokens_per_second_after_first"] > best[n]["tokens_per_second_after_first"]:
            best[n] = s
base = best[names[0]]
print("| run | tokens/s | ratio | step peak MB | ratio | final loss | SGEMM GFLOP/s |")
print("|---|---:|---:|---:|---:|---:|---:|")
for n in names:
    s = best[n]
    print(f"| {n} | {s['tokens_per_second_after_first']:.0f} | "
          f"{s['tokens_per_second_after_first'] / base['tokens_per_second_after_first']:.2f}x | "
          f"{s['step_peak_bytes'] / 1e6:.1f} | {s['step_peak_bytes'] / base['step_peak_bytes']:.2f}x | "
          f"{s['final_loss']:.6f} | {s['sgemm_gflops']:.0f} |")
EOF
