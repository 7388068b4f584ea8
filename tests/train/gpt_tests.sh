#!/usr/bin/env bash
# train_gpt tests, run by ctest: gpt_tests.sh <train_gpt> <mpiexec> <case>
#   meshes   a tiny model (2 layers, d_model 32, 4 heads, context 16, batch 8) for 30 steps on
#            1 device; data=2, model=2 (2 ranks); data=2,model=2 and data=4 with the optimizer
#            state over 'data' (2 ranks x 2 devices); model=4 and data=2,model=2 (4 ranks):
#            per-step losses agree to 1e-5 relative, the loss falls, and the same run twice is
#            bit-identical
#   resume   30 steps on data=2,model=2 against 15 steps on data=4 (2 ranks x 2 devices) +
#            --resume on model=4 (4 ranks): the losses of steps 16-30 and the final checkpoints'
#            .npy files (parameters and AdamW's moments) agree; --sample from the checkpoint
#            gives the same text on 1 device and on model=2
#   comm     what rank 0 sends in one step (CommStats, --comm-stats) equals Megatron's with sequence
#            parallelism: per block 2 all_gathers and 2 psum_scatters of (B/d, T/m, C) over 'model'
#            each way, one psum over 'data' of each split weight, one psum over ('data','model') of
#            each replicated parameter (the tied embedding twice: the embeddings' shard_map and the
#            loss's each sum their part of its gradient), the loss and the clipping norm;
#            on data=2,model=2 and data=4 (4 ranks) and model=2 (2 ranks)
#   torch    the same run as benchmarks/torch_gpt.py (PyTorch) from the same initial parameters
#            (--dump-init): the per-step losses agree to 1e-4 relative, the validation losses too
#            (skipped, exit 77, without Debian's python3-torch)
#   bfloat16 --dtype bfloat16 (float32 master weights, bfloat16 compute) on 1 device, data=2 and
#            model=2: the per-step losses agree across meshes to 2e-2 relative and with float32's
#            to 3e-2, the loss falls, and the summary names the dtype and a step's time split
#   trace    --trace FILE on data=2,model=2 (2 ranks x 2 devices): one Chrome-trace JSON file
#            with both ranks, each rank's device threads named, each rank's collectives (the
#            all_gathers and psum_scatters over 'model', the gradients' psums) and products in
#            it, --trace-steps steps of spans; --json's stdout stays one JSON object per line
#   jit      --jit (value_and_grad and the optimizer's update as one jitted program, its shard_map
#            differentiated inside the jit) against the eager step: float32 on data=2 (2 ranks),
#            data=2,model=2 with the optimizer state over 'data' (2 ranks x 2 devices), bfloat16 on
#            model=2: per-step and validation losses agree to 1e-5 relative
#   fsdp     --fsdp (each parameter and its AdamW moments split over 'data') against the replicated
#            run: on data=2 (2 ranks; eager and --jit) and data=2,model=2 (2 ranks x 2 devices) the
#            per-step and validation losses agree to 1e-5 relative, and the bytes of parameters and
#            optimizer state a rank holds (the live-array counter) are <= 0.6x the replicated run's
#   scale    --remat blocks and dots (1 device, data=2,model=2 on 2 ranks x 2 devices, with --jit on
#            data=2), --micro-batches 2 and 4 (data=2; data=2,model=2; --jit) and the hybrid mesh
#            replica=2,fsdp=2 (4 ranks, eager and --jit; 2 ranks x 2 devices) against the plain run:
#            per-step and validation losses agree to 1e-5 relative; the step's peak array bytes
#            with --remat blocks are below 0.65x the plain run's, with --micro-batches 4 below 0.6x;
#            bad --remat, --micro-batches and hybrid --mesh values fail on every rank
#   errors   bad input: a clear message on every rank, a non-zero exit
set -euo pipefail
app=$1 mpiexec=$2 case=$3
work=$(mktemp -d /tmp/shard_gpt_test.XXXXXX)
trap 'rm -rf "$work"' EXIT
python=python3
if [ -x /usr/bin/python3 ] && /usr/bin/python3 -c "import numpy" 2>/dev/null; then python=/usr/bin/python3; fi
compare="$python $(dirname "$0")/compare.py"
fail="$(dirname "$0")/../expect_failure.sh"
run() {  # run <ranks> <devices per rank> <args...>
  local n=$1 k=$2
  shift 2
  "$mpiexec" -n "$n" --oversubscribe "$app" --devices-per-rank "$k" "$@"
}
tiny=(--layers 2 --d-model 32 --heads 4 --context 16 --batch 8 --steps 30 --warmup 5 --lr 3e-3 --eval-every 10
      --val-windows 64 --seed 5 --json --log-every 1)
case $case in
  meshes)
    run 1 1 "${tiny[@]}" > "$work/one.jsonl"
    run 1 1 "${tiny[@]}" > "$work/one_again.jsonl"
    run 2 1 "${tiny[@]}" --mesh data=2 > "$work/d2.jsonl"
    run 2 1 "${tiny[@]}" --mesh model=2 > "$work/m2.jsonl"
    run 2 2 "${tiny[@]}" --mesh data=2,model=2 --shard-optimizer-state > "$work/d2m2z.jsonl"
    run 2 2 "${tiny[@]}" --mesh data=4 --shard-optimizer-state > "$work/d4z.jsonl"
    run 4 1 "${tiny[@]}" --mesh model=4 > "$work/m4.jsonl"
    run 4 1 "${tiny[@]}" --mesh data=2,model=2 > "$work/d2m2.jsonl"
    $compare losses 1e-5 "$work/one.jsonl" "$work/d2.jsonl" "$work/m2.jsonl" "$work/d2m2z.jsonl" "$work/d4z.jsonl" \
      "$work/m4.jsonl" "$work/d2m2.jsonl"
    $compare identical "$work/one.jsonl" "$work/one_again.jsonl"
    # --max-seconds: rank 0's clock stops every rank after the same step (here the first)
    run 2 1 "${tiny[@]}" --mesh data=2 --max-seconds 1e-6 > "$work/stop.jsonl"
    grep -q '"summary": true.*"steps": 1,' "$work/stop.jsonl" || { echo "--max-seconds did not stop at step 1"; cat "$work/stop.jsonl"; exit 1; }
    grep -q '"mesh": "data=2,model=2"' "$work/d2m2.jsonl" || { echo "d2m2: not on data=2,model=2"; exit 1; }
    # the validation losses agree too, and the loss falls
    $python - "$work/one.jsonl" "$work/m4.jsonl" "$work/d2m2z.jsonl" <<'PY'
import json, sys
def rows(p, key): return [json.loads(x)[key] for x in open(p) if f'"{key}"' in x]
ref = rows(sys.argv[1], "val_loss")
for p in sys.argv[2:]:
    got = rows(p, "val_loss")
    assert len(got) == len(ref) == 4 and all(abs(a - b) < 1e-5 * a for a, b in zip(ref, got)), (p, ref, got)
l = rows(sys.argv[1], "loss")
assert l[-1] < 0.8 * l[0], f"loss did not fall: {l[0]} -> {l[-1]}"
print(f"loss {l[0]:.4f} -> {l[-1]:.4f}, validation {ref[0]:.4f} -> {ref[-1]:.4f}")
PY
    ;;
  resume)
    run 2 2 "${tiny[@]}" --mesh data=2,model=2 --checkpoint-dir "$work/a" > "$work/a.jsonl"
    run 2 2 "${tiny[@]}" --mesh data=4 --max-steps 15 --checkpoint-dir "$work/b" > "$work/b1.jsonl"
    run 4 1 "${tiny[@]}" --mesh model=4 --checkpoint-dir "$work/b" --resume > "$work/b2.jsonl"
    if ! grep -q '"step": 15,' "$work/b1.jsonl" || grep -q '"step": 16,' "$work/b1.jsonl"; then
      echo "b1 did not stop at 15"; exit 1
    fi
    grep '"loss"' "$work/a.jsonl" | sed -n '16,30p' > "$work/a_tail.jsonl"
    grep '"loss"' "$work/b2.jsonl" > "$work/b2_loss.jsonl"
    $compare losses 1e-5 "$work/a_tail.jsonl" "$work/b2_loss.jsonl"
    steps_a=("$work"/a/step-*) steps_b=("$work"/b/step-*)
    a=${steps_a[-1]} b=${steps_b[-1]}
    if [ "$(basename "$a")" != step-00000030 ] || [ "$(basename "$b")" != step-00000030 ]; then
      echo "final checkpoints: $a $b"; exit 1
    fi
    # The key bias is skipped: it adds q.bk to every score of a query, which the softmax cancels,
    # so its gradient is rounding noise (about 1e-9) that Adam scales up to +-lr steps; the
    # losses do not depend on it (compared above), its values differ between meshes. Its AdamW
    # moments are opt.{mu,nu}.<position>: h0.bk and h1.bk are parameters 7 and 23.
    $compare npy 1e-4 "$a" "$b" '\.bk\.npy$|^opt\.(mu|nu)\.(7|23)\.npy$'
    moments=("$a"/opt.mu.*.npy)
    [ -f "${moments[0]}" ] || { echo "no optimizer state in $a"; exit 1; }
    run 1 1 "${tiny[@]}" --checkpoint-dir "$work/a" --sample --prompt "The " --sample-tokens 40 > "$work/s1.json"
    run 2 1 "${tiny[@]}" --mesh model=2 --checkpoint-dir "$work/a" --sample --prompt "The " --sample-tokens 40 > "$work/s2.json"
    run 2 1 "${tiny[@]}" --mesh data=2 --checkpoint-dir "$work/a" --sample --prompt "The " --temperature 0.8 --sample-tokens 40 > "$work/s3.json"
    run 1 1 "${tiny[@]}" --checkpoint-dir "$work/a" --sample --prompt "The " --temperature 0.8 --sample-tokens 40 > "$work/s4.json"
    cmp "$work/s1.json" "$work/s2.json" || { echo "greedy samples differ across meshes"; cat "$work/s1.json" "$work/s2.json"; exit 1; }
    cmp "$work/s3.json" "$work/s4.json" || { echo "temperature samples differ across meshes"; exit 1; }
    $python - "$work/s1.json" <<'PY'
import json, sys
s = json.loads(open(sys.argv[1]).read())
assert s["sample"].startswith("The ") and len(s["sample"]) == 44 and s["step"] == 30, s
print("sample:", repr(s["sample"]))
PY
    ;;
  comm)
    for spec in "4 data=2,model=2" "4 data=4,model=1" "2 data=1,model=2"; do
      read -r n mesh <<<"$spec"
      run "$n" 1 "${tiny[@]}" --mesh "$mesh" --max-steps 2 --comm-stats > "$work/comm.jsonl"
      $python - "$work/comm.jsonl" "$mesh" <<'PY'
import json, sys
rows = [json.loads(x) for x in open(sys.argv[1]) if x.startswith("{")]
got = next(r["comm_per_step"] for r in rows if "comm_per_step" in r)
d, m = (int(kv.split("=")[1]) for kv in sys.argv[2].split(","))
L, C, H, T, B, V, f = 2, 32, 4, 16, 8, 256, 4  # the tiny model; float32
b, t = B // d, T // m
want = {}
def add(key, calls, nbytes):
    c0, b0 = want.get(key, (0, 0))
    want[key] = (c0 + calls, b0 + nbytes)
if m > 1:  # sequence parallel: per block and direction, an all_gather of this device's tokens
    add("all_gather 'model'", 4 * L, 4 * L * b * t * C * f)  # (2 forward, 2 as psum_scatter's transpose)
    add("psum_scatter 'model'", 4 * L, 4 * L * b * T * C * f)  # sends the whole (b, T, C) partial sum
split = L * (3 * C * C // m + 3 * C // m + C // m * C + C * 4 * C // m + 4 * C // m + 4 * C // m * C) + t * C
replicated = [V * C] * 2 + [C] * (6 * L) + [C, C]  # wte (tied: twice), ln1 g b, bo, ln2 g b, b2; lnf g b
if d > 1:
    add("psum 'data'", 10 * L + 1, split * f)  # each split weight, and wpe's rows
add("psum ('data','model')", len(replicated) + 2, sum(replicated) * f + f + 8)  # + the loss (float32), the norm (float64)
add("to_host ", 1, f)  # the loss value
if got != {k: list(v) for k, v in want.items()}:
    sys.exit(f"{sys.argv[2]}: sent {got}, Megatron + sequence parallel theory {want}")
print(f"{sys.argv[2]}: one step sends what the theory says: {got}")
PY
    done
    ;;
  bfloat16)
    run 1 1 "${tiny[@]}" > "$work/f32.jsonl"
    run 1 1 "${tiny[@]}" --dtype bfloat16 > "$work/one.jsonl"
    run 2 1 "${tiny[@]}" --dtype bfloat16 --mesh data=2 > "$work/d2.jsonl"
    run 2 1 "${tiny[@]}" --dtype bfloat16 --mesh model=2 > "$work/m2.jsonl"
    $compare losses 2e-2 "$work/one.jsonl" "$work/d2.jsonl" "$work/m2.jsonl"
    $compare losses 3e-2 "$work/f32.jsonl" "$work/one.jsonl"
    $python - "$work/one.jsonl" <<'PY'
import json, sys
rows = [json.loads(x) for x in open(sys.argv[1]) if x.startswith("{")]
l = [r["loss"] for r in rows if "loss" in r and "step" in r]
assert l[-1] < 0.8 * l[0], f"loss did not fall: {l[0]} -> {l[-1]}"
summary = [r for r in rows if r.get("summary")][0]
assert summary["dtype"] == "bfloat16" and summary["bf16_gemm_gflops"] > 0, summary
split = [r for r in rows if "time_split_ms" in r][0]["time_split_ms"]
assert split["products"] > 0 and split["step"] > 0, split
print("bfloat16: the loss falls", l[0], "->", l[-1], "; a step's split", split)
PY
    "$fail" "expected float32 or bfloat16" "$mpiexec" -n 1 "$app" "${tiny[@]}" --dtype float16
    ;;
  torch)
    if ! /usr/bin/python3 -c "import torch, numpy" 2>/dev/null; then echo "SKIP: no python3-torch"; exit 77; fi
    run 2 1 "${tiny[@]}" --mesh model=2 --dump-init "$work/init" > "$work/shard.jsonl"
    /usr/bin/python3 "$(dirname "$0")/../../benchmarks/torch_gpt.py" "${tiny[@]}" --threads 1 --init-npy "$work/init" \
      > "$work/torch.jsonl"
    $compare losses 1e-4 "$work/shard.jsonl" "$work/torch.jsonl"
    /usr/bin/python3 - "$work/shard.jsonl" "$work/torch.jsonl" <<'PY'
import json, sys
def rows(p): return [json.loads(x)["val_loss"] for x in open(p) if '"val_loss"' in x]
a, b = rows(sys.argv[1]), rows(sys.argv[2])
assert len(a) == len(b) == 4 and all(abs(x - y) < 1e-4 * x for x, y in zip(a, b)), (a, b)
print("validation losses equal PyTorch's:", a)
PY
    ;;
  trace)
    run 2 2 "${tiny[@]}" --mesh data=2,model=2 --max-steps 6 --trace "$work/t.json" --trace-steps 2 \
      > "$work/trace.jsonl"
    $python - "$work/t.json" "$work/trace.jsonl" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
for line in open(sys.argv[2]):
    json.loads(line)  # stdout stays JSON lines
ev = doc["traceEvents"]
assert doc["otherData"]["ranks"] == 2 and doc["otherData"]["dropped_events"] == 0, doc["otherData"]
procs = {e["pid"]: e["args"]["name"] for e in ev if e.get("name") == "process_name"}
assert procs == {0: "rank 0", 1: "rank 1"}, procs
threads = {(e["pid"], e["args"]["name"]) for e in ev if e.get("name") == "thread_name"}
assert {(0, "device 0"), (0, "device 1"), (1, "device 2"), (1, "device 3")} <= threads, threads
spans = [e for e in ev if e["ph"] == "X"]
assert all(e["dur"] >= 0 and e["ts"] >= -1 for e in spans)
for r in (0, 1):
    names = {e["name"] for e in spans if e["pid"] == r and e["cat"] == "collective"}
    for want in ("all_gather 'model'", "psum_scatter 'model'"):
        assert want in names, (r, want, names)
    assert any(e["pid"] == r and e["cat"] == "products" for e in spans), r
    assert any(e["pid"] == r and e["cat"] in ("start", "wait") or e["pid"] == r and e["name"].startswith("psum") for e in spans), r
    # --trace-steps 2: the optimizer ran twice on this rank
    assert sum(1 for e in spans if e["pid"] == r and e["cat"] == "optimizer") == 2, r
print(len(spans), "spans; collectives of each rank:", sorted({e["name"] for e in spans if e["cat"] == "collective"}))
PY
    ;;
  errors)
    t=(--layers 1 --d-model 16 --heads 2 --context 8 --steps 3 --warmup 1 --val-windows 8)
    both() {  # both <message regex> <ranks> <devices per rank> <args...>: every rank prints it
      local re=$1 n=$2 k=$3
      shift 3
      $fail -e "rank 0\] error: $re" -e "rank $((n - 1))\] error: $re" \
        "$mpiexec" -n "$n" --oversubscribe "$app" --devices-per-rank "$k" "$@"
    }
    both "--heads 2 is not divisible by model=4" 2 2 "${t[@]}" --batch 4 --mesh model=4
    both "--batch 6 is not divisible by data=4" 2 2 "${t[@]}" --mesh data=4 --batch 6
    both "--context 6 is not divisible by model=4 \(the sequence is split" 2 2 --layers 1 --d-model 16 --heads 4 --context 6 --batch 4 --steps 3 --warmup 1 --mesh model=4
    both "--data-dir /nonexistent is not a directory" 2 1 "${t[@]}" --batch 4 --data-dir /nonexistent
    both "--warmup 5 must be less than --steps 3" 2 1 --layers 1 --d-model 16 --heads 2 --context 8 --batch 4 --steps 3 --warmup 5
    both "--mesh 'data=3' does not multiply to the 2 devices" 2 1 "${t[@]}" --batch 4 --mesh data=3
    both "no checkpoint in --checkpoint-dir $work/none" 2 1 "${t[@]}" --batch 4 --sample --checkpoint-dir "$work/none"
    both ".*--trace /nonexistent/t.json: cannot write the timeline there" 2 1 "${t[@]}" --batch 4 --trace /nonexistent/t.json
    run 2 1 "${t[@]}" --batch 4 --checkpoint-dir "$work/c" --json > /dev/null
    both ".* holds the model layers=1,d_model=16,heads=2,context=8,vocab=256, this run has layers=1,d_model=32" \
      2 1 --layers 1 --d-model 32 --heads 2 --context 8 --batch 4 --steps 3 --warmup 1 --checkpoint-dir "$work/c" --resume
    ;;
  jit)
    run 2 1 "${tiny[@]}" --mesh data=2 > "$work/e1.jsonl"
    run 2 1 "${tiny[@]}" --mesh data=2 --jit > "$work/j1.jsonl"
    run 2 2 "${tiny[@]}" --mesh data=2,model=2 --shard-optimizer-state > "$work/e2.jsonl"
    run 2 2 "${tiny[@]}" --mesh data=2,model=2 --shard-optimizer-state --jit > "$work/j2.jsonl"
    run 2 1 "${tiny[@]}" --mesh model=2 --dtype bfloat16 > "$work/e3.jsonl"
    run 2 1 "${tiny[@]}" --mesh model=2 --dtype bfloat16 --jit > "$work/j3.jsonl"
    for k in 1 2 3; do
      $compare losses 1e-5 "$work/e$k.jsonl" "$work/j$k.jsonl"
      $python - "$work/e$k.jsonl" "$work/j$k.jsonl" <<'PY'
import json, sys
def rows(p, key): return [json.loads(x)[key] for x in open(p) if f'"{key}"' in x]
a, b = rows(sys.argv[1], "val_loss"), rows(sys.argv[2], "val_loss")
assert len(a) == len(b) == 4 and all(abs(x - y) <= 1e-5 * x for x, y in zip(a, b)), (a, b)
assert len(rows(sys.argv[2], "loss")) == 30
PY
    done
    ;;
  fsdp)
    run 2 1 "${tiny[@]}" --mesh data=2 > "$work/r1.jsonl"
    run 2 1 "${tiny[@]}" --mesh data=2 --fsdp > "$work/f1.jsonl"
    run 2 1 "${tiny[@]}" --mesh data=2 --fsdp --jit > "$work/fj1.jsonl"
    run 2 2 "${tiny[@]}" --mesh data=2,model=2 > "$work/r2.jsonl"
    run 2 2 "${tiny[@]}" --mesh data=2,model=2 --fsdp > "$work/f2.jsonl"
    for pair in r1:f1 r1:fj1 r2:f2; do
      a=${pair%%:*} b=${pair##*:}
      $compare losses 1e-5 "$work/$a.jsonl" "$work/$b.jsonl"
      $python - "$work/$a.jsonl" "$work/$b.jsonl" <<'PY'
import json, sys
def rows(p, key): return [json.loads(x)[key] for x in open(p) if f'"{key}"' in x]
a, b = rows(sys.argv[1], "val_loss"), rows(sys.argv[2], "val_loss")
assert len(a) == len(b) == 4 and all(abs(x - y) <= 1e-5 * x for x, y in zip(a, b)), (a, b)
ra, rb = rows(sys.argv[1], "param_state_bytes")[0], rows(sys.argv[2], "param_state_bytes")[0]
assert rows(sys.argv[2], "fsdp")[0] is True and rb <= 0.6 * ra, (ra, rb)
print(f"{sys.argv[2]}: parameters + optimizer state {rb} bytes per rank, {rb / ra:.3f}x the replicated {ra}")
PY
    done
    ;;
  scale)
    short=(--layers 2 --d-model 32 --heads 4 --context 32 --batch 16 --steps 10 --warmup 2 --lr 3e-3 --eval-every 5
           --val-windows 32 --seed 7 --json --log-every 1)
    same() {  # same <plain.jsonl> <other.jsonl>: per-step and validation losses to 1e-5 relative
      $compare losses 1e-5 "$1" "$2"
      $python - "$1" "$2" <<'PY'
import json, sys
def rows(p, key): return [json.loads(x)[key] for x in open(p) if f'"{key}"' in x]
a, b = rows(sys.argv[1], "val_loss"), rows(sys.argv[2], "val_loss")
assert len(a) == len(b) == 3 and all(abs(x - y) <= 1e-5 * x for x, y in zip(a, b)), (a, b)
PY
    }
    peak_below() {  # peak_below <plain.jsonl> <other.jsonl> <ratio>
      $python - "$@" <<'PY'
import json, sys
def peak(p): return [json.loads(x)["step_peak_bytes"] for x in open(p) if '"summary"' in x][0]
a, b, r = peak(sys.argv[1]), peak(sys.argv[2]), float(sys.argv[3])
assert b < r * a, (sys.argv[2], a, b)
print(f"{sys.argv[2]}: step peak {b} bytes, {b / a:.2f}x the plain run's {a}")
PY
    }
    # Rematerialization
    run 1 1 "${short[@]}" > "$work/p1.jsonl"
    run 1 1 "${short[@]}" --remat blocks > "$work/b1.jsonl"
    run 1 1 "${short[@]}" --remat dots > "$work/d1.jsonl"
    same "$work/p1.jsonl" "$work/b1.jsonl"
    same "$work/p1.jsonl" "$work/d1.jsonl"
    peak_below "$work/p1.jsonl" "$work/b1.jsonl" 0.65
    run 2 2 "${short[@]}" --mesh data=2,model=2 > "$work/p4.jsonl"
    run 2 2 "${short[@]}" --mesh data=2,model=2 --remat blocks > "$work/b4.jsonl"
    same "$work/p4.jsonl" "$work/b4.jsonl"
    run 2 1 "${short[@]}" --mesh data=2 > "$work/p2.jsonl"
    run 2 1 "${short[@]}" --mesh data=2 --remat blocks --jit > "$work/bj2.jsonl"
    same "$work/p2.jsonl" "$work/bj2.jsonl"
    # Gradient accumulation
    run 2 1 "${short[@]}" --mesh data=2 --micro-batches 2 > "$work/m2.jsonl"
    run 2 1 "${short[@]}" --mesh data=2 --micro-batches 4 > "$work/m4.jsonl"
    run 2 1 "${short[@]}" --mesh data=2 --micro-batches 2 --jit > "$work/mj2.jsonl"
    for f in m2 m4 mj2; do same "$work/p2.jsonl" "$work/$f.jsonl"; done
    peak_below "$work/p2.jsonl" "$work/m4.jsonl" 0.6
    run 2 2 "${short[@]}" --mesh data=2,model=2 --micro-batches 2 > "$work/m4d.jsonl"
    same "$work/p4.jsonl" "$work/m4d.jsonl"
    # Hybrid sharding: FSDP over 'fsdp', data parallel over replica x fsdp
    run 4 1 "${short[@]}" --mesh data=4 > "$work/p44.jsonl"
    run 4 1 "${short[@]}" --mesh replica=2,fsdp=2 > "$work/h4.jsonl"
    run 4 1 "${short[@]}" --mesh replica=2,fsdp=2 --jit --remat blocks --micro-batches 2 > "$work/hj4.jsonl"
    run 2 2 "${short[@]}" --mesh replica=2,fsdp=2 > "$work/h22.jsonl"
    for f in h4 hj4 h22; do same "$work/p44.jsonl" "$work/$f.jsonl"; done
    # Bad values: a clear message on every rank
    t=(--layers 1 --d-model 16 --heads 2 --context 8 --batch 4 --steps 3 --warmup 1 --val-windows 8)
    # shellcheck disable=SC2089  # the quotes in the messages are matched literally, as meant
    for bad in "--remat all:--remat all: expected none, blocks or dots" \
               "--micro-batches 3:--batch 4 is not divisible by --micro-batches 3 x data=2" \
               "--micro-batches 0:--micro-batches must be >= 1" \
               "--mesh replica=3:--mesh 'replica=3' does not multiply to the 2 devices" \
               "--mesh replica=1,data=2:bad --mesh 'replica=1,data=2'"; do
      # shellcheck disable=SC2086,SC2090  # the flag and its value split into words (no quotes in them)
      $fail -e "rank 0\] error: ${bad#*:}" -e "rank 1\] error: ${bad#*:}" \
        "$mpiexec" -n 2 --oversubscribe "$app" "${t[@]}" ${bad%%:*}
    done
    ;;
  *) echo "unknown case $case"; exit 2 ;;
esac
