#!/usr/bin/env bash
# tests/fuzz.sh [seconds per target, default 20]: builds the libFuzzer targets of fuzz/ with
# clang (the "fuzz" preset: AddressSanitizer, UBSan, coverage) and runs each from its corpus
# in fuzz/corpus/<name> (copied to a scratch directory: what a run adds stays out of the repo).
# Fails on the first crash, sanitizer report or unexpected exception, leaving the input in
# build/fuzz/crashes/<name>/ (add it to the corpus and fix the parser: it is a regression test
# from then on). CI runs it after ./tests/run_tests.sh (.ci/run).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds=${1:-20}
command -v clang++ > /dev/null || { echo "fuzz.sh: clang++ is missing (apt-get install clang)" >&2; exit 1; }
cmake --preset fuzz > /dev/null
targets=(npy_header manifest partition_spec int_list idx)
cmake --build --preset fuzz --target "${targets[@]/#/fuzz_}"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1
for t in "${targets[@]}"; do
  work=$(mktemp -d)
  cp fuzz/corpus/"$t"/* "$work"/
  mkdir -p build/fuzz/crashes/"$t"
  echo "fuzz.sh: $t for $seconds s from $(find fuzz/corpus/"$t" -type f | wc -l) corpus inputs"
  if ! build/fuzz/fuzz/fuzz_"$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix=build/fuzz/crashes/"$t"/ "$work" > build/fuzz/"$t".log 2>&1; then
    tail -40 build/fuzz/"$t".log >&2
    echo "fuzz.sh: $t failed; the input is in build/fuzz/crashes/$t/" >&2
    rm -rf "$work"
    exit 1
  fi
  grep -E "^stat::number_of_executed_units|^stat::new_units_added" build/fuzz/"$t".log | tr '\n' ' '
  echo
  rm -rf "$work"
done
echo "fuzz.sh: all ${#targets[@]} targets ran ${seconds} s each without a failure"
