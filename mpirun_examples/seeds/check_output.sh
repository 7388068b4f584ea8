#!/usr/bin/env bash
# check_output.sh EXPECTED COMMAND...: runs COMMAND (its output is shown) and passes iff it
# exits 0 and every non-empty line of the file EXPECTED that does not start with '#' occurs in
# the output, each on a later line than the previous one (a fixed string, not a regex).
set -u
expected=$1
shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne 0 ]; then
  echo "check_output: the command exited with $rc" >&2
  exit 1
fi
mapfile -t lines <<<"$out"
at=0
while IFS= read -r want || [ -n "$want" ]; do
  [ -z "$want" ] && continue
  [ "${want:0:1}" = "#" ] && continue
  found=-1
  for ((i = at; i < ${#lines[@]}; i++)); do
    if [[ "${lines[$i]}" == *"$want"* ]]; then
      found=$i
      break
    fi
  done
  if [ "$found" -lt 0 ]; then
    echo "check_output: missing (after output line $at): '$want'" >&2
    exit 1
  fi
  at=$((found + 1))
done <"$expected"
echo "check_output: every line of $(basename "$expected") found in order"
