#!/usr/bin/env bash
# benchmarks/parse_time.sh [repeats, default 3] [compiler, default c++]: how long a user file that
# includes <shard/shard.hpp> takes to compile (-fsyntax-only, -O2 -std=c++20), without and with a
# precompiled header of the umbrella built with the same flags (what CMake's
# `target_precompile_headers(app PRIVATE <shard/shard.hpp>)` gives a consumer), measured side by
# side in one run (best of the repeats each). Prints both times and their ratio.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repeats=${1:-3}
cxx=${2:-c++}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
read -ra mpi_flags <<< "$(pkg-config --cflags ompi-cxx 2>/dev/null || echo "-isystem /usr/lib/x86_64-linux-gnu/openmpi/include")"
flags=(-std=c++20 -O2 -Iinclude "${mpi_flags[@]}")
cat > "$work/user.cpp" <<'CPP'
#include <shard/shard.hpp>
int main() { return 0; }
CPP
# The precompiled header: a copy of the umbrella in its own directory, searched first.
mkdir -p "$work/pch/shard"
printf '#include "%s/include/shard/shard.hpp"\n' "$PWD" > "$work/pch/shard/shard.hpp"
start=$(date +%s.%N)
"$cxx" "${flags[@]}" -x c++-header "$work/pch/shard/shard.hpp" -o "$work/pch/shard/shard.hpp.gch"
build_pch=$(awk -v a="$(date +%s.%N)" -v b="$start" 'BEGIN { print a - b }')
best() {  # best wall time of $repeats runs of "$@"
  local b=1e9 t s
  for ((i = 0; i < repeats; i++)); do
    s=$(date +%s.%N)
    "$@"
    t=$(awk -v a="$(date +%s.%N)" -v b="$s" 'BEGIN { print a - b }')
    b=$(awk -v t="$t" -v b="$b" 'BEGIN { print (t < b ? t : b) }')
  done
  echo "$b"
}
plain=$(best "$cxx" "${flags[@]}" -fsyntax-only "$work/user.cpp")
with_pch=$(best "$cxx" -I"$work/pch" "${flags[@]}" -Winvalid-pch -Werror=invalid-pch -fsyntax-only "$work/user.cpp")
printf 'parse_time: %s, -O2 -std=c++20, best of %d\n' "$("$cxx" --version | head -1)" "$repeats"
printf 'parse_time: a file including <shard/shard.hpp>: %.2f s without a precompiled header, %.2f s with one\n' \
  "$plain" "$with_pch"
printf 'parse_time: ratio %.2f (building the precompiled header, once per target: %.1f s)\n' \
  "$(awk -v a="$with_pch" -v b="$plain" 'BEGIN { print a / b }')" "$build_pch"
