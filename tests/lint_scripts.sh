#!/usr/bin/env bash
# The scripts.lint test: bash -n and shellcheck on every shell script of the repository, found
# when the test runs (so scripts added after cmake configured are checked too):
#   mpirun_examples/*.sh *.sbatch, tests/multinode/*.sh *.sbatch, tests/*.sh, tests/train/*.sh, tests/adversarial/*.sh,
#   cmake/*.sh, benchmarks/*.sh
#   tests/lint_scripts.sh [repository root]   (default: the parent of this script's directory)
# Fails on a syntax error or any shellcheck finding (every severity, info included). Sourced
# files are followed (-x), their paths taken relative to the sourcing script (-P SCRIPTDIR).
# A finding that is wrong gets a "# shellcheck disable=SCxxxx" with the reason, in the script.
set -uo pipefail
root=${1:-$(dirname "${BASH_SOURCE[0]}")/..}
cd "$root" || exit 1

shopt -s nullglob
scripts=(mpirun_examples/*.sh mpirun_examples/*.sbatch tests/multinode/*.sh tests/multinode/*.sbatch
         tests/*.sh tests/train/*.sh tests/adversarial/*.sh tests/consumer/*.sh cmake/*.sh benchmarks/*.sh)
shopt -u nullglob
if [ ${#scripts[@]} -eq 0 ]; then
  echo "lint_scripts: no scripts found under $PWD" >&2
  exit 1
fi
if ! command -v shellcheck >/dev/null 2>&1; then
  echo "lint_scripts: shellcheck is not installed (./cmake/install-deps.sh installs it)" >&2
  exit 1
fi
echo "lint_scripts: $(shellcheck --version | sed -n 's/^version: /shellcheck /p'), ${#scripts[@]} scripts in $PWD"

failed=()
for f in "${scripts[@]}"; do
  ok=1
  bash -n "$f" || ok=0
  shellcheck -x -P SCRIPTDIR "$f" || ok=0
  if [ $ok = 1 ]; then echo "ok    $f"; else echo "FAIL  $f"; failed+=("$f"); fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "lint_scripts: ${#failed[@]} of ${#scripts[@]} scripts fail: ${failed[*]}" >&2
  exit 1
fi
echo "lint_scripts: all ${#scripts[@]} scripts pass bash -n and shellcheck"
