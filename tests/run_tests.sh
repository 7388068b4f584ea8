#!/usr/bin/env bash
# The whole test suite from a fresh clone: installs what is missing, builds with warnings as
# errors, and runs every ctest test (single-rank unit tests and the mpiexec tests at 1-4
# ranks and 1-2 devices per rank). Extra arguments go to ctest (e.g. -L unit, -R sharded).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
./cmake/install-deps.sh
# shellcheck source-path=SCRIPTDIR source=../cmake/mpi-env.sh
source cmake/mpi-env.sh

start=$(date +%s)
cmake --preset ci >/dev/null
cmake --build --preset ci -j "$(nproc)"
echo "build: $(( $(date +%s) - start )) s"
# First the multi-node tests (network-namespace hosts, one at a time) with their output: the
# ranks on each host, the equality with the single-host run and the bytes that crossed between
# hosts. Then everything else.
ctest --preset ci --label-regex multinode --verbose "$@"
ctest --preset ci -j "${SHARD_TEST_JOBS:-2}" --label-exclude multinode "$@"
echo "build and tests: $(( $(date +%s) - start )) s"
