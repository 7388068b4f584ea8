#!/usr/bin/env bash
# tests/check_format.sh [repo]: C++ files follow .clang-format (clang-format --dry-run). Files
# written before the check are listed in tests/format_pending.txt until a change formats them:
# the check fails on an unformatted file that is not listed, and on a listed file that is
# formatted now (remove its line: the list only shrinks). A new file, or a file a change
# reformats, stays formatted; a listed file that is gone fails too. Skipped (exit 77, ctest's
# SKIP_RETURN_CODE) when clang-format is missing.
set -euo pipefail
cd "${1:-$(dirname "${BASH_SOURCE[0]}")/..}"
fmt=$(command -v clang-format || command -v clang-format-14 || true)
if [[ -z $fmt ]]; then
  echo "check_format: clang-format not found (cmake/install-deps.sh installs it); skipped"
  exit 77
fi
declare -A pending=()
while IFS= read -r line; do
  [[ -z $line || $line == \#* ]] && continue
  pending["$line"]=1
done < tests/format_pending.txt
fail=0
checked=0
while IFS= read -r f; do
  if "$fmt" --dry-run --Werror "$f" >/dev/null 2>&1; then
    checked=$((checked + 1))
    if [[ -n ${pending[$f]:-} ]]; then
      echo "check_format: $f is formatted now: remove it from tests/format_pending.txt" >&2
      fail=1
    fi
  elif [[ -z ${pending[$f]:-} ]]; then
    echo "check_format: $f does not follow .clang-format: run clang-format -i $f" >&2
    fail=1
  fi
done < <(git ls-files '*.cpp' '*.hpp' '*.h')
for f in "${!pending[@]}"; do
  if [[ ! -f $f ]]; then
    echo "check_format: $f is listed in tests/format_pending.txt but does not exist: remove its line" >&2
    fail=1
  fi
done
echo "check_format: $checked files formatted, ${#pending[@]} listed in tests/format_pending.txt as still to format"
exit $fail
