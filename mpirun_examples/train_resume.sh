#!/usr/bin/env bash
# Stops after one epoch with a checkpoint, then resumes the same run on another mesh and rank
# count: 2 ranks with data=2 first, then 4 ranks with data=2,model=2.
#   ./mpirun_examples/train_resume.sh [checkpoint dir]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source-path=SCRIPTDIR source=../cmake/mpi-env.sh
source cmake/mpi-env.sh
dir=${1:-/tmp/shard_train_resume}
rm -rf "$dir"
set -x
# 234 steps = one epoch of Fashion-MNIST at batch 256; --epochs 2 keeps the learning-rate
# schedule of the whole run
mpirun -n 2 build/release/apps/train_mlp --mesh data=2 --epochs 2 --max-steps 234 --checkpoint-dir "$dir"
ls "$dir"
mpirun -n 4 build/release/apps/train_mlp --mesh data=2,model=2 --epochs 2 --checkpoint-dir "$dir" --resume
