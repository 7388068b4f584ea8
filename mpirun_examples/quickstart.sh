#!/usr/bin/env bash
# Quick start: installs what is missing, builds Shard (Release) and runs the main example on
# 2 ranks with 4 logical devices each. Extra arguments go to the example.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
./cmake/install-deps.sh
# shellcheck source=../cmake/mpi-env.sh
source cmake/mpi-env.sh

cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)"
echo
echo "+ mpirun -n 2 build/release/apps/sharding_tour --devices-per-rank 4 --size 2048 $*"
mpirun -n 2 build/release/apps/sharding_tour --devices-per-rank 4 --size 2048 "$@"
