#!/usr/bin/env bash
# train_mlp against PyTorch (Debian's python3-torch, CPU, one thread per process) on the same
# model (784-1024-1024-10, Adam, global batch 256), measured back to back in one run, in ROUNDS
# rounds (default 3) of alternating order: PyTorch in one process and with
# DistributedDataParallel (gloo) on 2 processes; train_mlp (the model's forward pass,
# shard::grad, shard::optim) on 1 rank and on 2 ranks (data=2, one OpenBLAS thread each).
# Prints medians over the rounds and the medians of the per-round ratios (each ratio from runs
# made minutes apart at most, so the VM's drift cancels), and the peak memory of a rank of each
# train_mlp run.
#   ./benchmarks/train_vs_torch.sh [build dir]   (needs python3-torch: apt-get install python3-torch)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
app=${1:-build/release}/apps/train_mlp
py=/usr/bin/python3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
summary() { $py -c 'import json,sys; s=[json.loads(l) for l in sys.stdin if "summary" in l][0]; print(s["samples_per_second"], s["peak_rss_mb"])'; }
shard() { mpirun -n "$1" --bind-to core "$app" --mesh "data=$1" --epochs 1 --max-steps 400 --json "${@:2}" | summary; }
torch() { $py benchmarks/torch_mlp.py --world "$1" --steps 400 2>/dev/null | sed -n 's/.*samples_per_second=//p'; }
rounds=${ROUNDS:-3}
"$app" --help > /dev/null
mpirun -n 1 "$app" --dataset synthetic --layers 8,4 --samples 16 --batch 8 --epochs 1 | grep -o "OpenBLAS core [^;]*"
declare -A r mem
for round in $(seq "$rounds"); do
  if [ $((round % 2)) = 1 ]; then order="t1 t2 s1 s2"; else order="s2 s1 t2 t1"; fi
  for k in $order; do
    m=0
    case $k in
      t1) v=$(torch 1) ;; t2) v=$(torch 2) ;;
      s1) read -r v m < <(shard 1) ;; s2) read -r v m < <(shard 2) ;;
    esac
    r[$k]="${r[$k]:-} $v"
    mem[$k]=$m
    if [ "$m" = 0 ]; then echo "round $round $k: $v samples/s"; else echo "round $round $k: $v samples/s, peak $m MB"; fi
  done
done
$py - "${r[t1]}" "${r[t2]}" "${r[s1]}" "${r[s2]}" "${mem[s1]}" "${mem[s2]}" <<'PY'
import statistics, sys
t1, t2, s1, s2 = ([float(v) for v in a.split()] for a in sys.argv[1:5])
ms1, ms2 = float(sys.argv[5]), float(sys.argv[6])
med = statistics.median
print(f"PyTorch 1 process {med(t1):.0f}, DDP 2 processes {med(t2):.0f}; train_mlp 1 rank {med(s1):.0f}, "
      f"2 ranks {med(s2):.0f} samples/s (medians of {len(s1)} rounds)")
ratio = lambda a, b: med([x / y for x, y in zip(a, b)])
print(f"per-round ratios, median: train_mlp 2 ranks / PyTorch 1 process = {ratio(s2, t1):.2f}x (goal 2.0), "
      f"/ DDP = {ratio(s2, t2):.2f}x (goal 3.0), scaling 2 ranks / 1 rank = {ratio(s2, s1):.2f}x")
print(f"peak memory of a rank: train_mlp 1 rank {ms1:.0f} MB, 2 ranks {ms2:.0f} MB")
PY
