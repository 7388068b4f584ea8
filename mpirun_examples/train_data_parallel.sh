#!/usr/bin/env bash
# Data parallel training: the batch split over every rank, one OpenBLAS thread per rank.
#   ./mpirun_examples/train_data_parallel.sh [ranks] [train_mlp flags...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ranks=${1:-2}
shift || true
export OPENBLAS_NUM_THREADS=1
set -x
mpirun -n "$ranks" --bind-to core build/release/apps/train_mlp --mesh "data=$ranks" "$@"
