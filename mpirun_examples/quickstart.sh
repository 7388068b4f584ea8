#!/usr/bin/env bash
# Quick start: installs what is missing (Debian packages, Fashion-MNIST included), builds Shard
# (Release) and trains the MLP on 2 ranks x 2 logical devices with a 2 x 2 ('data', 'model')
# mesh: data parallel across the ranks, tensor parallel inside each. Extra arguments go to
# train_mlp (e.g. --epochs 12 for the full run).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
./cmake/install-deps.sh
# shellcheck source-path=SCRIPTDIR source=../cmake/mpi-env.sh
source cmake/mpi-env.sh

cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)"
echo
echo "+ mpirun -n 2 build/release/apps/train_mlp --devices-per-rank 2 --mesh data=2,model=2 --epochs 2 $*"
mpirun -n 2 build/release/apps/train_mlp --devices-per-rank 2 --mesh data=2,model=2 --epochs 2 "$@"
