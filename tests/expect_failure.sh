#!/usr/bin/env bash
# expect_failure.sh REGEX COMMAND...
# expect_failure.sh -e REGEX [-e REGEX ...] COMMAND...
# Passes iff COMMAND exits non-zero within its ctest TIMEOUT and its output (stdout + stderr)
# matches every extended REGEX (each on some line: e.g. one per rank's error line).
set -u
regexes=()
if [ "${1:-}" = "-e" ]; then
  while [ "${1:-}" = "-e" ]; do
    regexes+=("$2")
    shift 2
  done
else
  regexes+=("$1")
  shift
fi
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -eq 0 ]; then
  echo "expect_failure: command exited 0, expected a failure" >&2
  exit 1
fi
for regex in "${regexes[@]}"; do
  if ! grep -Eq -- "$regex" <<<"$out"; then
    echo "expect_failure: output does not match /$regex/" >&2
    exit 1
  fi
done
echo "expect_failure: exit code $rc and ${#regexes[@]} pattern(s) found, as expected"
