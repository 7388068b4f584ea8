#!/usr/bin/env bash
# The README and docs/ keep true: links resolve, named scripts, apps and tests exist, every
# shard:: name in the API tables is declared in a header, the README's first program is the
# one the build compiles and a test runs (tests/check_docs.py).
set -euo pipefail
root=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
exec python3 "$root/tests/check_docs.py" "$root"
