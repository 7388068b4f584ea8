#!/usr/bin/env bash
# Multi-host benchmark (issue 19) on one machine: 2 "hosts" (network namespaces, netns.sh) x 1 rank,
# over TCP, on three links: the veth as it is, and emulated with tc on each host's eth0 (egress):
# 10 Gbit/s with 50 us delay each way (tbf for the rate, netem for the delay; a kernel without
# sch_netem gets the rate only and the table says so) and 1 Gbit/s (tbf):
#   collectives   collectives_bench across the hosts: Shard and the raw MPI call on the same link,
#                 their ratio, and the bus bandwidth against the link's rate
#   matmul        matmul_bench across the hosts: SUMMA (1x2, 1 rank per host) and Cannon (2x2,
#                 2 ranks per host, oversubscribed) against ScaLAPACK's pdgemm on the same ranks
#   train         train_mlp --mesh data=2 across the hosts against 1 rank on one host (samples/s)
#   bench.sh BUILD_DIR [--quick] [--links none,10g,1g] [--sizes 1M,4M,16M] [--steps N]
#            [--parts collectives,matmul,train]
# --quick (what ctest runs): the unshaped link only, 64K, a few steps; it checks the bench runs.
# Exits 77 (ctest: skipped) with the reason when it cannot make namespaces or shape links.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=netns.sh
source "$here/netns.sh"
build=$(cd "${1:?usage: bench.sh BUILD_DIR [--quick] [--links ...] [--sizes ...] [--steps N]}" && pwd)
shift
# shellcheck source=../../cmake/mpi-env.sh
source "$here/../../cmake/mpi-env.sh"

links=none,10g,1g
sizes=1M,4M,16M
collectives=psum,all_gather,psum_scatter,ppermute
steps=300
matmul_n=2048
parts=collectives,matmul,train
quick=0
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1; links=none; sizes=64K; collectives=psum,ppermute; steps=20; matmul_n=256 ;;
    --matmul-n) matmul_n=$2; shift ;;
    --links) links=$2; shift ;;
    --sizes) sizes=$2; shift ;;
    --collectives) collectives=$2; shift ;;
    --steps) steps=$2; shift ;;
    --parts) parts=$2; shift ;;
    *) echo "bench.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done

if ! why=$(mn_can_run); then
  echo "SKIP: $why"
  exit 77
fi
if [ "$links" != none ] && ! command -v tc >/dev/null; then
  echo "SKIP: needs tc (iproute2) to emulate links"
  exit 77
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/shard_multinode_bench.XXXXXX")
cleanup() {
  mn_teardown
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mn_setup 2
printf 'node0 slots=1\nnode1 slots=1\n' > "$work/hosts"
printf 'node0 slots=2\nnode1 slots=2\n' > "$work/hosts2"
net="${MN_SUBNET}.0/24"

across() {  # RANKS=4 for 2 ranks per host
  local hosts=$work/hosts
  [ "${RANKS:-2}" = 4 ] && hosts=$work/hosts2
  mn_exec node0 mpirun --hostfile "$hosts" --mca plm rsh --mca plm_rsh_agent "$here/launcher.sh" \
    --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include "$net" --mca oob_tcp_if_include "$net" \
    -x OPENBLAS_NUM_THREADS=1 -x OMPI_MCA_mpi_yield_when_idle=1 -n "${RANKS:-2}" --map-by node --bind-to none "$@"
}

# Whether this kernel has netem (the delay); tbf (the rate) is checked when shaping.
have_netem() {
  local ns
  ns=$(mn_ns node0)
  if ip netns exec "$ns" tc qdisc add dev eth0 root netem delay 1us 2>/dev/null; then
    ip netns exec "$ns" tc qdisc del dev eth0 root
    return 0
  fi
  return 1
}

# shape LINK: the qdiscs of both hosts' eth0 (egress; both directions are shaped).
shape() {
  local h ns
  for h in node0 node1; do
    ns=$(mn_ns "$h")
    ip netns exec "$ns" tc qdisc del dev eth0 root 2>/dev/null || true
    case $1 in
      none) continue ;;
      10g)
        if [ "$netem" = 1 ]; then
          ip netns exec "$ns" tc qdisc add dev eth0 root handle 1: netem delay 50us limit 100000 &&
            ip netns exec "$ns" tc qdisc add dev eth0 parent 1:1 handle 10: tbf rate 10gbit burst 4mb latency 100ms
        else
          ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate 10gbit burst 4mb latency 100ms
        fi ;;
      1g) ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate 1gbit burst 1mb latency 100ms ;;
      *) echo "bench.sh: unknown link '$1' (none, 10g, 1g)" >&2; exit 2 ;;
    esac 2>"$work/tc.err" || { echo "SKIP: tc cannot shape the veth here: $(cat "$work/tc.err")"; exit 77; }
  done
}

netem=0
have_netem && netem=1

link_name() {
  case $1 in
    10g) if [ "$netem" = 1 ]; then echo "10 Gbit/s + 50 us"; else echo "10 Gbit/s (no delay: no sch_netem)"; fi ;;
    1g) echo "1 Gbit/s" ;;
    *) echo "veth" ;;
  esac
}

link_rate() {  # bytes/s of the emulated link (empty: unshaped)
  case $1 in 10g) echo 1250000000 ;; 1g) echo 125000000 ;; *) echo "" ;; esac
}

python=python3
[ -x /usr/bin/python3 ] && python=/usr/bin/python3
dataset=(--dataset fashion-mnist)
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte ] || [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
  dataset=(--dataset synthetic --samples 8192)

echo "multi-host benchmark: 2 namespace hosts x 1 rank, TCP over veth; $(nproc) cores; OpenBLAS core ${OPENBLAS_CORETYPE:-auto-detected}"
has_part() { [[ ",$parts," == *",$1,"* ]]; }
IFS=, read -r -a link_list <<< "$links"
if has_part collectives; then
echo
echo "| link | collective | bytes | Shard µs | raw MPI µs | Shard/raw | bus GB/s | of link rate |"
echo "|---|---|---:|---:|---:|---:|---:|---:|"
for link in "${link_list[@]}"; do
  shape "$link"
  across "$build/apps/collectives_bench" --sizes "$sizes" --collectives "$collectives" --json > "$work/coll_$link.jsonl"
  $python - "$(link_name "$link")" "$(link_rate "$link")" "$work/coll_$link.jsonl" <<'EOF'
import json, sys
name, rate, path = sys.argv[1], sys.argv[2], sys.argv[3]
for line in open(path):
    line = line.strip()
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    of = f"{100 * r['busbw_GBps'] * 1e9 / float(rate):.0f}%" if rate else "-"
    print(f"| {name} | {r['collective']} | {r['bytes']} | {r['shard_us']:.0f} | {r['raw_us']:.0f} | "
          f"{r['shard_us'] / r['raw_us']:.3f} | {r['busbw_GBps']:.3f} | {of} |")
EOF
done
fi
if has_part matmul; then
echo
echo "| link | matmul n=$matmul_n float64 | ranks | s | GFLOP/s | vs pdgemm | exposed wait s | unoverlapped wait s | hidden |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
for link in "${link_list[@]}"; do
  shape "$link"
  RANKS=2 across "$build/apps/matmul_bench" --n "$matmul_n" --mesh 1x2 --repeats 3 --algorithms summa,scalapack --json \
    > "$work/mm2_$link.jsonl"
  RANKS=4 across "$build/apps/matmul_bench" --n "$matmul_n" --mesh 2x2 --repeats 3 --algorithms cannon,summa,scalapack --json \
    > "$work/mm4_$link.jsonl"
  $python - "$(link_name "$link")" "$work/mm2_$link.jsonl" "$work/mm4_$link.jsonl" <<'EOF'
import json, sys
name = sys.argv[1]
for path in sys.argv[2:]:
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if not r.get("ok", False):
            print(f"FAIL: {r['algorithm']} on {r['mesh']} gave a wrong product")
            sys.exit(1)
        print(f"| {name} | {r['algorithm']} on {r['mesh']} ({r['ranks'] // 2} per host) | {r['ranks']} | {r['median_s']:.3f} | "
              f"{r['gflops']:.1f} | {r['vs_pdgemm']:.2f}x | {r['wait_s']:.3f} | "
              + (f"{r['wait_unoverlapped_s']:.3f} | {100 * r['overlapped']:.0f}% |" if r['algorithm'] != 'scalapack' else "- | - |"))
EOF
done
fi
if has_part train; then
echo
echo "| link | train_mlp | gradient sums | samples/s | vs 1 rank | exposed sum wait ms/step |"
echo "|---|---|---|---:|---:|---:|"
train=("$build/apps/train_mlp" "${dataset[@]}" --max-steps "$steps" --json --seed 5)
field() {  # field FILE KEY: KEY of the run's summary line
  $python -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1]) if l.startswith("{") and "summary" in l][-1][sys.argv[2]])' "$1" "$2"
}
shape none
mn_exec node0 mpirun -n 1 -x OPENBLAS_NUM_THREADS=1 "${train[@]}" > "$work/one.jsonl"
one=$(field "$work/one.jsonl" samples_per_second)
echo "| - | 1 rank, 1 host | - | $one | 1.00 | - |"
variants=("--overlap off" "--overlap on" "--overlap on --grad-dtype bfloat16")
[ "$quick" = 1 ] && variants=("--overlap on")
for link in "${link_list[@]}"; do
  shape "$link"
  for v in "${variants[@]}"; do
    # shellcheck disable=SC2086  # the variant's flags are separate words
    across "${train[@]}" --mesh data=2 $v > "$work/two_$link.jsonl"
    two=$(field "$work/two_$link.jsonl" samples_per_second)
    wait_ms=$(field "$work/two_$link.jsonl" grad_wait_ms_per_step)
    echo "| $(link_name "$link") | data=2, 2 hosts x 1 rank | ${v#--} | $two | $($python -c "print(f'{$two / $one:.2f}')") | $wait_ms |"
  done
done
fi
shape none
if [ "$quick" = 1 ]; then echo "bench: ran (quick)"; fi
