#!/usr/bin/env bash
# Data x tensor parallel training, as in the JAX tutorial's 4-way data, 2-way model layout:
# 4 ranks x 2 logical devices, mesh data=4,model=2 ('model' pairs are a rank's two devices).
# On a machine with fewer cores than ranks x devices this oversubscribes (it still runs).
#   ./mpirun_examples/train_data_model.sh [train_mlp flags...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source-path=SCRIPTDIR source=../cmake/mpi-env.sh
source cmake/mpi-env.sh
set -x
mpirun -n 4 build/release/apps/train_mlp --devices-per-rank 2 --mesh data=4,model=2 "$@"
