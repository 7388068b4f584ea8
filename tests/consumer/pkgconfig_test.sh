#!/usr/bin/env bash
# pkgconfig_test.sh PKG_CONFIG MPICXX PC_DIR OUT_DIR SOURCE_INCLUDE MPIEXEC_COMMAND...
#
# Builds consumer/main.cpp as a user without CMake would, against the Shard whose shard.pc is
# in PC_DIR:  mpicxx -std=c++20 main.cpp $(pkg-config --cflags --libs shard)
# then runs it as MPIEXEC_COMMAND... OUT_DIR/consumer --devices-per-rank 2. Fails if the flags
# name SOURCE_INCLUDE (the source tree's headers instead of the installed ones).
set -euo pipefail
pkg_config=$1 cxx=$2 pc_dir=$3 out=$4 source_include=$5
shift 5
export PKG_CONFIG_PATH="$pc_dir${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
src="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/main.cpp"

flags=$("$pkg_config" --cflags --libs shard)
echo "pkg-config: shard $("$pkg_config" --modversion shard) from $pc_dir"
if [[ " $flags " == *"$source_include"* ]]; then
  echo "pkgconfig_test: the flags name the source tree's $source_include: $flags" >&2
  exit 1
fi
mkdir -p "$out"
set -x
# shellcheck disable=SC2086  # the flags are separate words
"$cxx" -std=c++20 -O2 "$src" -o "$out/consumer" $flags
"$@" "$out/consumer" --devices-per-rank 2
