#!/usr/bin/env bash
# tests/compile_fail/check.sh <compiler> <source> [flags...]: the source must fail to compile,
# its first error must contain the text of its "// expect-error: " line, and the whole
# diagnostic must stay within 20 lines (what a newcomer reads). ctest runs one per source.
set -uo pipefail
cxx=$1
src=$2
shift 2
want=$(sed -n 's|^// expect-error: ||p' "$src" | head -1)
if [[ -z "$want" ]]; then
  echo "check.sh: $src has no '// expect-error: ' line" >&2
  exit 2
fi
out=$("$cxx" -std=c++20 -fsyntax-only "$@" "$src" 2>&1)
rc=$?
lines=$(printf '%s\n' "$out" | grep -c .)
first=$(printf '%s\n' "$out" | grep -m1 "error:")
printf '%s\n' "$out" | head -40
echo "---"
echo "exit code $rc, $lines lines of diagnostics; first error: $first"
if [[ $rc -eq 0 ]]; then
  echo "check.sh: $src compiled; it must not" >&2
  exit 1
fi
if [[ "$first" != *"$want"* ]]; then
  echo "check.sh: the first error does not contain '$want'" >&2
  exit 1
fi
if (( lines > 20 )); then
  echo "check.sh: $lines lines of diagnostics (at most 20)" >&2
  exit 1
fi
echo "check.sh: $src fails as expected in $lines lines"
