#!/usr/bin/env bash
# expect_failure.sh REGEX COMMAND...: passes iff COMMAND exits non-zero within its ctest
# TIMEOUT and its output (stdout + stderr) matches the extended REGEX.
set -u
regex=$1
shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -eq 0 ]; then
  echo "expect_failure: command exited 0, expected a failure" >&2
  exit 1
fi
if ! grep -Eq -- "$regex" <<<"$out"; then
  echo "expect_failure: output does not match /$regex/" >&2
  exit 1
fi
echo "expect_failure: exit code $rc and /$regex/ found, as expected"
