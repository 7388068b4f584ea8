#!/usr/bin/env bash
# train_gpt against PyTorch (Debian's python3-torch, CPU) on the same byte-level GPT, data,
# batches and hyper-parameters (benchmarks/torch_gpt.py is the PyTorch reference), measured one
# after the other in one run:
#   a) train_gpt on RANKS ranks, --mesh data=RANKS, one OpenBLAS thread each, bound to cores;
#   b) torch_gpt.py in one process with RANKS threads (torch's and OpenBLAS's);
#   c) torch_gpt.py with DistributedDataParallel (gloo) on RANKS processes of one thread;
#   d) train_gpt --dtype bfloat16 as a);
#   e) torch_gpt.py --ddp --autocast (torch.autocast to bfloat16 around the forward) as c);
#   f) train_gpt --dtype bfloat16 --jit (the step as one jitted program) as a).
# With --repeats N (default 2) the six runs are repeated N times in turn (a b c d e f a ...: this
# VM's speed drifts over minutes) and each configuration's fastest run counts.
# Prints a markdown table of tokens/s (training steps only, evaluation excluded), the ratio
# Shard / that run, and the final training and validation losses (the runs start from
# different random weights, so the losses agree only roughly; train_gpt --dump-init DIR and
# torch_gpt.py --init-npy DIR start both from the same ones).
#   ./benchmarks/gpt_vs_torch.sh [build dir] [--layers 6] [--d-model 384] [--heads 6] [--context 256]
#                                [--batch 16] [--steps 20] [--warmup W] [--ranks 2] [--repeats 2]
#                                [-- flags for all runs]
# The defaults are the ~10M-parameter model; --warmup defaults to steps/5 (train_gpt wants it < --steps).
# Needs python3-torch: apt-get install python3-torch.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=build/release
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then build=$1; shift; fi
layers=6 d_model=384 heads=6 context=256 batch=16 steps=20 ranks=2 warmup='' repeats=2
extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --layers) layers=$2; shift 2 ;;
    --d-model) d_model=$2; shift 2 ;;
    --heads) heads=$2; shift 2 ;;
    --context) context=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,19p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "gpt_vs_torch.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
warmup=${warmup:-$((steps / 5))}
app=$build/apps/train_gpt
py=/usr/bin/python3
# shellcheck source-path=SCRIPTDIR source=../cmake/mpi-env.sh
source cmake/mpi-env.sh
export OMP_NUM_THREADS=1  # train_gpt's ranks; torch_gpt.py sets its own thread counts
flags=(--layers "$layers" --d-model "$d_model" --heads "$heads" --context "$context" --batch "$batch"
       --steps "$steps" --warmup "$warmup" --json "${extra[@]}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$app" --help > /dev/null
$py -c 'import torch' 2> /dev/null || { echo "gpt_vs_torch.sh: needs python3-torch (apt-get install python3-torch)" >&2; exit 1; }
echo "$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) cores ($(lscpu | sed -n 's/^Model name: *//p')); torch $($py -c 'import torch; print(torch.__version__)')"
mpirun -n 1 "$app" --layers 1 --d-model 32 --heads 2 --context 16 --batch 2 --steps 2 --warmup 0 --eval-every 0 \
  --val-windows 2 2> /dev/null | grep -o "OpenBLAS core [^;]*" || true
echo "model: $layers layers, d_model $d_model, $heads heads, context $context, global batch $batch, $steps steps (warm-up $warmup)"

case $repeats in '' | *[!0-9]* | 0) echo "gpt_vs_torch.sh: --repeats must be a positive integer" >&2; exit 2 ;; esac
for r in $(seq "$repeats"); do
  echo "a) mpirun -n $ranks train_gpt --mesh data=$ranks (round $r of $repeats)" >&2
  mpirun -n "$ranks" --bind-to core "$app" --mesh "data=$ranks" "${flags[@]}" > "$work/shard.$r.jsonl"
  echo "b) torch_gpt.py, 1 process x $ranks threads (round $r of $repeats)" >&2
  $py benchmarks/torch_gpt.py --threads "$ranks" "${flags[@]}" > "$work/torch.$r.jsonl"
  echo "c) torch_gpt.py --ddp, $ranks processes x 1 thread (round $r of $repeats)" >&2
  $py benchmarks/torch_gpt.py --ddp --nproc "$ranks" --threads 1 "${flags[@]}" > "$work/ddp.$r.jsonl"
  echo "d) mpirun -n $ranks train_gpt --mesh data=$ranks --dtype bfloat16 (round $r of $repeats)" >&2
  mpirun -n "$ranks" --bind-to core "$app" --mesh "data=$ranks" --dtype bfloat16 "${flags[@]}" > "$work/shard_bf16.$r.jsonl"
  echo "e) torch_gpt.py --ddp --autocast, $ranks processes x 1 thread (round $r of $repeats)" >&2
  $py benchmarks/torch_gpt.py --ddp --autocast --nproc "$ranks" --threads 1 "${flags[@]}" > "$work/ddp_bf16.$r.jsonl"
  echo "f) mpirun -n $ranks train_gpt --mesh data=$ranks --dtype bfloat16 --jit (round $r of $repeats)" >&2
  mpirun -n "$ranks" --bind-to core "$app" --mesh "data=$ranks" --dtype bfloat16 --jit "${flags[@]}" > "$work/shard_bf16_jit.$r.jsonl"
done

$py - "$ranks" "$repeats" "$work" <<'PY'
import json, math, sys
ranks, repeats, work = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def summary_of(path):
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            row = json.loads(line)
            if row.get("summary"):
                return row
    sys.exit(f"gpt_vs_torch.sh: no summary row in {path}")

def summary(name):  # the fastest of the rounds; every round's rate is printed
    rows = [summary_of(f"{work}/{name}.{r}.jsonl") for r in range(1, repeats + 1)]
    print(f"{name}: tokens/s by round: " + ", ".join(f"{x['tokens_per_second']:.0f}" for x in rows))
    return max(rows, key=lambda x: x["tokens_per_second"])

def num(row, key, fmt):
    v = row.get(key)
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)

shard, torch1, ddp, shard_bf16, ddp_bf16, shard_bf16_jit = (
    summary(p) for p in ("shard", "torch", "ddp", "shard_bf16", "ddp_bf16", "shard_bf16_jit"))
runs = [(f"train_gpt, {ranks} ranks (data={ranks})", shard),
        (f"PyTorch, 1 process x {ranks} threads", torch1),
        (f"PyTorch DDP (gloo), {ranks} processes x 1 thread", ddp),
        (f"train_gpt --dtype bfloat16, {ranks} ranks", shard_bf16),
        (f"PyTorch DDP with bfloat16 autocast, {ranks} processes x 1 thread", ddp_bf16),
        (f"train_gpt --dtype bfloat16 --jit, {ranks} ranks", shard_bf16_jit)]
print()
print(f"{shard['params']} parameters; {shard['steps']} steps; best of {repeats} round(s) each; train_gpt MFU {num(shard, 'mfu', '.3f')} "
      f"of its measured SGEMM rate ({num(shard, 'sgemm_gflops', '.1f')} GFLOP/s)")
print()
print(f"train_gpt --dtype bfloat16: MFU {num(shard_bf16, 'mfu', '.3f')} of the SGEMM rate, {num(shard_bf16, 'mfu_bf16', '.3f')} "
      f"of its measured bfloat16 GEMM rate ({num(shard_bf16, 'bf16_gemm_gflops', '.1f')} GFLOP/s)")
print()
print("| run | tokens/s | Shard float32 / run | Shard bfloat16 / run | final train loss | final val loss |")
print("|---|---:|---:|---:|---:|---:|")
def ratio(a, row):
    return a["tokens_per_second"] / row["tokens_per_second"] if row["tokens_per_second"] > 0 else float("nan")
for name, row in runs:
    print(f"| {name} | {row['tokens_per_second']:.0f} | {ratio(shard, row):.2f}x | {ratio(shard_bf16, row):.2f}x | "
          f"{num(row, 'final_loss', '.4f')} | {num(row, 'final_val_loss', '.4f')} |")
PY
