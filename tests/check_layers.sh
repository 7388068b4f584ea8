#!/usr/bin/env bash
# tests/check_layers.sh [repo]: the library's shape (DESIGN.md "Layers"). Fails on
#   - an include that climbs the layer order: a file of include/shard/<layer>/ or src/<layer>/
#     including a header of a later layer (shard/<layer>/..., or a private src header
#     "<layer>/...");  the error header (shard/error.hpp) is the ground floor; shard.hpp (the
#     umbrella) and the flat layout's forwarding headers (include/shard/<name>.hpp) sit above every
#     layer: users include them, the library does not. src/shard.cpp, the library's top, sits
#     above every layer too: its install_layer_hooks registers the Runtime hooks of each layer
#     above the runtime (the runtime names no later layer). Climbs still to be removed are listed
#     in tests/layers_pending.txt as "file -> included header"; the check fails on a climb not
#     listed there and on a listed one that is gone (remove its line: the list only shrinks);
#   - a library file (src/, include/) past 700 lines;
#   - a tracked build output (object files, archives, build folders).
set -euo pipefail
cd "${1:-$(dirname "${BASH_SOURCE[0]}")/..}"

declare -A rank=([mpi]=1 [core]=2 [runtime]=3 [sharding]=4 [comm]=5 [array]=6 [linalg]=7 [ops]=8 [spmd]=9
                 [autodiff]=10 [jit]=11 [vmap]=11 [io]=12 [train]=12)
pending_file=tests/layers_pending.txt
declare -A pending=()
if [[ -f $pending_file ]]; then
  while IFS= read -r line; do
    [[ -z $line || $line == \#* ]] && continue
    pending["$line"]=1
  done < "$pending_file"
fi

layer_of() {  # include/shard/<layer>/... or src/<layer>/...; error.hpp/.cpp are the ground floor
  # The umbrella shard.hpp and the flat layout's forwarding headers (include/shard/<name>.hpp):
  # above every layer, for users only.
  local p=${1#include/shard/}
  p=${p#src/}
  local l=${p%%/*}
  if [[ $l == "$p" ]]; then  # a root file
    [[ $p == error.hpp || $p == error.cpp ]] && echo 0 || echo 99
    return
  fi
  echo "${rank[$l]:-0}"
}

fail=0
climbs=0
declare -A seen=()
while IFS= read -r f; do
  own=$(layer_of "$f")
  [[ $f == src/* && $own -eq 99 && $f != src/shard.cpp ]] && { echo "check_layers: $f is in no layer folder of src/" >&2; fail=1; continue; }
  [[ $own -eq 99 ]] && continue  # the umbrella, the forwarding headers and src/shard.cpp may include anything
  if [[ $own -eq 0 && $f != include/shard/error.hpp && $f != src/error.cpp ]]; then
    echo "check_layers: $f is in no layer folder (DESIGN.md \"Layers\")" >&2
    fail=1
    continue
  fi
  while IFS= read -r inc; do
    target=$inc
    [[ $target == shard/* ]] && target=${target#shard/} || target="src/$target"
    tl=$(layer_of "$target")
    if [[ $tl -gt $own ]]; then
      key="$f -> $inc"
      seen["$key"]=1
      climbs=$((climbs + 1))
      if [[ -z ${pending[$key]:-} ]]; then
        echo "check_layers: $f includes $inc, a later layer: an include must point down the layers (DESIGN.md \"Layers\")" >&2
        fail=1
      fi
    fi
  done < <(sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]([A-Za-z0-9_]+\/[A-Za-z0-9_/.]+\.hpp)[">].*/\1/p' "$f")
done < <(git ls-files 'include/shard/*' 'src/*' | grep -E '\.(hpp|cpp)$')

for key in "${!pending[@]}"; do
  if [[ -z ${seen[$key]:-} ]]; then
    echo "check_layers: '$key' is listed in $pending_file but no longer climbs: remove the line" >&2
    fail=1
  fi
done

long=$(git ls-files 'src/*' 'include/*' | xargs wc -l | awk '$2 != "total" && $1 > 700 {print "  " $2 " (" $1 " lines)"}')
if [[ -n $long ]]; then
  echo "check_layers: library files past 700 lines (split them along a concept):" >&2
  echo "$long" >&2
  fail=1
fi

outputs=$(git ls-files | grep -E '\.(o|obj|a|so|dylib|gch|pch)$|(^|/)(build|CMakeFiles)/' || true)
if [[ -n $outputs ]]; then
  echo "check_layers: build outputs are tracked:" >&2
  while IFS= read -r o; do echo "  $o" >&2; done <<< "$outputs"
  fail=1
fi

echo "check_layers: $climbs climbing includes (${#pending[@]} listed in $pending_file as still to remove)"
exit $fail
