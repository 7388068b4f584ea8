#!/usr/bin/env bash
# The whole test suite from a fresh clone: installs what is missing, builds with warnings as
# errors, and runs every ctest test (single-rank unit tests and the mpiexec tests at 1-4
# ranks and 1-2 devices per rank). Extra arguments go to ctest (e.g. -L unit, -R sharded).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
./cmake/install-deps.sh
# shellcheck source-path=SCRIPTDIR source=../cmake/mpi-env.sh
source cmake/mpi-env.sh

# The slow tier, run by CI (.ci/run sets SHARD_SANITIZERS=1, SHARD_FULL_MATRIX=1 and
# SHARD_FUZZ_SECONDS=20) and on request; without it the command stays under 20 minutes on 2
# cores. SHARD_FULL_MATRIX=1: the op table's property tests in the ctest run below take every
# spec of every operand instead of their fixed-seed sample (tests/mpi/test_util.hpp). First (CI reads the closing
# line of the last ctest run) the sanitizer stage: the library and the MPI tests built with
# ASan + UBSan (preset asan, no apps), the 2-rank MPI tests under them (tests/sanitizers.cmake,
# tests/sanitizers/lsan.supp); about 25 minutes on 2 cores.
if [[ "${SHARD_SANITIZERS:-0}" == 1 ]]; then
  asan_start=$(date +%s)
  cmake --preset asan >/dev/null
  cmake --build --preset asan -j "$(nproc)"
  echo "asan build: $(( $(date +%s) - asan_start )) s"
  SHARD_FULL_MATRIX=0 ctest --preset asan -j "${SHARD_TEST_JOBS:-2}"  # the sample under ASan
  echo "asan build and tests: $(( $(date +%s) - asan_start )) s"
fi

# Then the parsers of outside input under libFuzzer (fuzz/, preset fuzz: clang, ASan, UBSan), each for
# SHARD_FUZZ_SECONDS from its corpus in fuzz/corpus (tests/fuzz.sh; about a minute at 10 s).
if [[ -n "${SHARD_FUZZ_SECONDS:-}" ]]; then
  ./tests/fuzz.sh "$SHARD_FUZZ_SECONDS"
fi

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
