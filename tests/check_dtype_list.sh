#!/usr/bin/env bash
# tests/check_dtype_list.sh [repo]: the dtype list is written once, as SHARD_DTYPE_TABLE in
# include/shard/core/dtype.hpp; every other file instantiates and dispatches from it
# (SHARD_FOR_EACH_DTYPE / _NUMERIC_ / _INT_ / _FLOAT_DTYPE, SHARD_FOR_EACH_DTYPE_PAIR, AllDtypes
# and the other type lists, for_each_dtype, visit_dtype, dtype_name, dtype_npy_descr), so a new
# dtype is one row there plus its kernels. Fails, naming the file and lines, where a file of
# src/ or include/ other than dtype.hpp
#   - calls one macro with two or more dtypes:
#         SHARD_INSTANTIATE_X(float)  SHARD_INSTANTIATE_X(double)
#   - instantiates (or declares extern) one template for two or more dtypes by hand:
#         template Tensor<float> f<float>(...);  template Tensor<double> f<double>(...);
#     (one dtype alone is allowed, e.g. a float-only kernel),
#   - spells two or more dtype names or .npy codes in code ("float32", "int64", "<f4", ...;
#     comments do not count).
# The dtypes are read from the table itself, so a new row is checked too.
set -euo pipefail
cd "${1:-$(dirname "${BASH_SOURCE[0]}")/..}"
list=include/shard/core/dtype.hpp

# The rows: X(__VA_ARGS__, <C++ type>, "<name>", <kind>, "<.npy descr>")
row='^[[:space:]]*X\(__VA_ARGS__, ([^,]+), "([^"]+)", [A-Z]+, "([^"]+)"\).*'
mapfile -t types < <(sed -nE "s/$row/\\1/p" "$list")
mapfile -t codes < <(sed -nE "s/$row/\"\\2\"\\n\"\\3\"/p" "$list")
if [ "${#types[@]}" -lt 2 ]; then
  echo "check_dtype_list: found ${#types[@]} rows of SHARD_DTYPE_TABLE in $list; update the row pattern in $0" >&2
  exit 1
fi
ere() { sed -E 's/[][\.|$*+?(){}^]/\\&/g' <<< "$1"; }
alt=""
for t in "${types[@]}"; do alt+="${alt:+|}$(ere "$t")"; done
tok="[A-Za-z_][A-Za-z0-9_:]*"

fail=0
report() {  # report <file> <what> <grep pattern of its lines>
  echo "check_dtype_list: $1 $2:" >&2
  grep -nE -- "$3" "$1" | sed 's/^/    /' >&2 || true
  fail=1
}

while IFS= read -r f; do
  [ "$f" = "$list" ] && continue
  code=$(sed -E 's#//.*##' "$f")

  # 1. One macro called with several dtypes (as its first argument).
  while read -r name; do
    [ -n "$name" ] && report "$f" "calls $name with several dtypes" "\\b$name\\(\\s*($alt)\\s*[,)]"
  done < <(grep -oE "\\b[A-Z][A-Z0-9_]*\\(\\s*($alt)\\s*[,)]" <<< "$code" |
             sed -E 's/\(\s*/ /; s/\s*[,)]$//' | sort -u | awk '{print $1}' | uniq -d)

  # 2. One template explicitly instantiated for several dtypes: the template instantiated on a
  #    line "[extern] template ..." is the name<args> before its '(' (or after class/struct);
  #    two lines whose args differ only in the dtypes they name are a list by hand.
  while read -r name; do
    [ -n "$name" ] && report "$f" "instantiates $name for several dtypes by hand" \
      "^\\s*(extern\\s+)?template\\s.*\\b$(ere "$name")<"
  done < <(grep -E '^\s*(extern\s+)?template\s+[^<[:space:]]' <<< "$code" |
             grep -oE "($tok<[^<>()]*>\\(|(class|struct)\\s+$tok<[^<>]*>)" |
             sed -E 's/^(class|struct)\s+//; s/\($//' | grep -E "[<,]\\s*($alt)\\s*[,>]" |
             awk '{ name = $0; sub(/<.*/, "", name); print name "\t" $0 }' |
             sort -u | awk -F'\t' '{print $1}' | uniq -d)

  # 3. Dtype names or .npy codes spelled in code.
  n=$({ grep -oF -f <(printf '%s\n' "${codes[@]}") <<< "$code" || true; } | sort -u | wc -l)
  if [ "$n" -ge 2 ]; then
    report "$f" "spells $n dtype names or .npy codes" "$(printf '%s\n' "${codes[@]}" | while read -r c; do ere "$c"; done | paste -sd'|')"
  fi
done < <(find src include -type f \( -name '*.hpp' -o -name '*.cpp' -o -name '*.h' \) | sort)

if [ "$fail" -ne 0 ]; then
  echo "check_dtype_list: take the dtypes from SHARD_DTYPE_TABLE in $list (SHARD_FOR_EACH_DTYPE and its" \
    "NUMERIC/INT/FLOAT sets, SHARD_FOR_EACH_DTYPE_PAIR, AllDtypes..., for_each_dtype, visit_dtype)" >&2
  exit 1
fi
echo "check_dtype_list: the ${#types[@]} dtypes are listed once, in $list (SHARD_DTYPE_TABLE)"
