#!/usr/bin/env bash
# Multi-node tests on one machine: real Open MPI jobs across "hosts" made of network namespaces
# (netns.sh), over TCP. Run by ctest (label multinode):
#   run.sh CASE BUILD_DIR
#   collectives  the collectives test binary on 2 hosts x 2 ranks, after shard_info shows where
#                the ranks are and how make_mesh groups them by host; checks TCP bytes crossed
#   train        train_mlp on 2 hosts x 2 ranks (data across hosts, model inside a host, ranks
#                placed round-robin so make_mesh must regroup them) equals the single-host run
#   train_gpt    train_gpt (a tiny transformer) on 2 hosts x 2 ranks, data=2 across the hosts and
#                model=2 (tensor + sequence parallel) inside each, gives the single-host losses
#   scale        a train_gpt over one rank's memory limit (SHARD_MEMORY_LIMIT) trained on a hybrid
#                mesh (replica across the hosts, fsdp inside) with remat and micro-batches gives
#                the losses of one unlimited rank; only the gradients' sums cross the hosts
#   separate     with only the shared-memory BTL (vader,self) the job must fail to connect:
#                the hosts are really separate
#   killed       kill -9 a harness run in the middle of training, then run again: it passes
#   slurm        starts Slurm on the hosts (slurm.sh: munged, slurmctld, 2 slurmds) and submits
#                mpirun_examples/slurm_train.sbatch with sbatch: train_gpt on 2 hosts x 2 ranks,
#                launched by srun --mpi=pmix, then by mpirun inside the allocation; each job's
#                losses must be train_gpt's under mpirun across the same hosts
# Exits 77 (ctest: skipped) with the reason when it cannot make namespaces (not root, no ip),
# or for slurm when Slurm or munge is not installed.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=netns.sh
source "$here/netns.sh"
# shellcheck source-path=SCRIPTDIR source=slurm.sh
source "$here/slurm.sh"
root=$(cd "$here/../.." && pwd)
case=${1:?usage: run.sh CASE BUILD_DIR}
build=$(cd "${2:?usage: run.sh CASE BUILD_DIR}" && pwd)
# shellcheck source=../../cmake/mpi-env.sh
source "$here/../../cmake/mpi-env.sh"

if ! why=$(mn_can_run); then
  echo "SKIP: $why"
  exit 77
fi
if [ "$case" = slurm ] && why=$(slurm_missing) && [ -n "$why" ]; then
  echo "SKIP: $why"
  exit 77
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/shard_multinode.XXXXXX")
cleanup() {
  mn_teardown
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

net="${MN_SUBNET}.0/24"
[ "$case" = killed ] || mn_setup 2
printf 'node0 slots=2\nnode1 slots=2\n' > "$work/hosts"

# mpirun across the hosts; it runs on node0 (the root namespace has no address on the subnet
# for the remote daemons to call back to) and starts node1's daemon through launcher.sh.
across() {
  local btl=$1
  shift
  mn_exec node0 mpirun --hostfile "$work/hosts" --mca plm rsh --mca plm_rsh_agent "$here/launcher.sh" \
    --mca pml ob1 --mca btl "$btl" --mca btl_tcp_if_include "$net" --mca oob_tcp_if_include "$net" \
    -x OPENBLAS_NUM_THREADS=1 "$@"
}

# crossed OUT cmd...: runs cmd (stdout to file OUT, or - for this stdout) and reports the bytes
# node1 received meanwhile; fails when too few crossed.
crossed() {
  local out=$1 before after
  shift
  before=$(mn_rx_bytes node1)
  if [ "$out" = - ]; then "$@"; else "$@" > "$out"; fi
  after=$(mn_rx_bytes node1)
  echo "bytes received by node1 over its veth: $((after - before))"
  if [ $((after - before)) -lt "${MIN_BYTES:-100000}" ]; then
    echo "FAIL: fewer than ${MIN_BYTES:-100000} bytes crossed between the hosts"
    exit 1
  fi
}

show_placement() {
  across tcp,vader,self -n 4 --map-by node "$build/apps/shard_info" | tee "$work/info.txt"
  grep -q "on 2 host(s)" "$work/info.txt" || { echo "FAIL: shard_info does not see 2 hosts"; exit 1; }
  # Round-robin placement (ranks 0, 2 on node0; 1, 3 on node1): make_mesh groups by host.
  grep -q "default mesh: Mesh('devices': 4) devices \[0, 2, 1, 3\]" "$work/info.txt" ||
    { echo "FAIL: make_mesh did not group the devices by host"; exit 1; }
}

# shellcheck disable=SC2054  # the commas are inside one argument (--layers 48,64,...)
small=(--dataset synthetic --layers 48,64,32,64,6 --samples 1024 --batch 64 --optimizer adam --lr 3e-3
       --seed 11 --mesh data=2,model=2 --max-steps "${MN_TRAIN_STEPS:-40}" --json --log-every 1)
# train_gpt's tiny model for the train_gpt and slurm cases (slurm_train.sbatch adds the mesh)
gpt_model=(--layers 2 --d-model 32 --heads 4 --context 16 --batch 8 --steps 30 --warmup 5 --lr 3e-3 --seed 5
           --val-windows 64 --eval-every 10 --json --log-every 1)
python=python3
if [ -x /usr/bin/python3 ] && /usr/bin/python3 -c "import numpy" 2>/dev/null; then python=/usr/bin/python3; fi

case $case in
  collectives)
    show_placement
    crossed - across tcp,vader,self -n 4 --map-by node "$build/tests/test_collectives" --gtest_brief=1
    # 2 devices per rank: groups of one collective span devices of one rank and of both hosts.
    crossed - across tcp,vader,self -n 4 --map-by node -x SHARD_DEVICES_PER_RANK=2 \
      "$build/tests/test_collectives" --gtest_brief=1
    echo "collectives: passed on 2 hosts x 2 ranks over TCP"
    ;;
  train)
    show_placement
    # On one host the 'data' groups would go through group-shared memory; --grad-sync mpi runs
    # the same algorithm as across the hosts, so the losses must be bit-identical.
    mpirun -n 4 "$build/apps/train_mlp" "${small[@]}" --grad-sync mpi > "$work/one_host.jsonl"
    crossed "$work/two_hosts.jsonl" across tcp,vader,self -n 4 --map-by node "$build/apps/train_mlp" "${small[@]}"
    grep -o '"hosts_by_data": "[^"]*"' "$work/two_hosts.jsonl"
    grep -q '"hosts_by_data": "node0|node1"' "$work/two_hosts.jsonl" ||
      { echo "FAIL: expected 'data' across the hosts and 'model' inside each"; exit 1; }
    $python "$here/../train/compare.py" identical "$work/one_host.jsonl" "$work/two_hosts.jsonl"
    echo "train: 2 hosts x 2 ranks give the single-host losses"
    ;;
  train_gpt)
    # shellcheck disable=SC2054  # the commas are inside one argument (--mesh data=2,model=2)
    gpt=("${gpt_model[@]}" --mesh data=2,model=2)
    mpirun -n 4 "$build/apps/train_gpt" "${gpt[@]}" > "$work/one_host.jsonl"
    MIN_BYTES=50000 crossed "$work/two_hosts.jsonl" across tcp,vader,self -n 4 --map-by node "$build/apps/train_gpt" "${gpt[@]}"
    $python "$here/../train/compare.py" losses 1e-5 "$work/one_host.jsonl" "$work/two_hosts.jsonl"
    # FSDP (parameters and optimizer state split over 'data', across the hosts) in a jitted step
    MIN_BYTES=50000 crossed "$work/two_hosts_fsdp.jsonl" across tcp,vader,self -n 4 --map-by node "$build/apps/train_gpt" "${gpt[@]}" --fsdp --jit
    $python "$here/../train/compare.py" losses 1e-5 "$work/one_host.jsonl" "$work/two_hosts_fsdp.jsonl"
    echo "train_gpt: 2 hosts x 2 ranks give the single-host losses (also with --fsdp --jit)"
    ;;
  scale)
    # A train_gpt that does not fit one rank's memory budget (SHARD_MEMORY_LIMIT: parameters,
    # AdamW state and activations of one rank alone need ~9.5 MB, the limit is 4 MiB), trained
    # across the 2 hosts on a hybrid mesh (replica across the hosts, fsdp inside each) with
    # --remat blocks and --micro-batches 2 under that limit, gives the losses of the same model
    # on one rank of one host with the limit lifted.
    gpt=(--layers 2 --d-model 64 --heads 4 --context 32 --batch 16 --steps 4 --warmup 1 --eval-every 2
         --val-windows 32 --json --log-every 1 --seed 3)
    mpirun -n 1 "$build/apps/train_gpt" "${gpt[@]}" > "$work/one_rank.jsonl"
    grep -o '"param_state_bytes": [0-9]*\|"step_peak_bytes": [0-9]*' "$work/one_rank.jsonl" | tr '\n' ' '
    echo "(one rank, no limit)"
    if SHARD_MEMORY_LIMIT=4M mpirun -n 1 -x SHARD_MEMORY_LIMIT "$build/apps/train_gpt" "${gpt[@]}" \
      > "$work/limited.txt" 2>&1; then
      echo "FAIL: one rank trained the model within SHARD_MEMORY_LIMIT=4M (it should not fit)"
      exit 1
    fi
    grep -m1 "memory limit is 4194304 bytes" "$work/limited.txt" ||
      { cat "$work/limited.txt"; echo "FAIL: no memory-limit error from the rank over its budget"; exit 1; }
    # shellcheck disable=SC2054  # the commas are inside one argument (--mesh replica=2,fsdp=2)
    hybrid=(--mesh replica=2,fsdp=2 --remat blocks --micro-batches 2 --comm-stats)
    MIN_BYTES=50000 crossed "$work/two_hosts.jsonl" across tcp,vader,self -n 4 --map-by node \
      -x SHARD_MEMORY_LIMIT=4M "$build/apps/train_gpt" "${gpt[@]}" "${hybrid[@]}"
    $python "$here/../train/compare.py" losses 1e-5 "$work/one_rank.jsonl" "$work/two_hosts.jsonl"
    # What crosses between the hosts: only the gradients' sums (over ('replica','fsdp')); the
    # parameters' all_gathers (and the shard_maps' reshards) are over 'fsdp', inside a host.
    comm=$(grep -o '"comm_per_step": {[^}]*}' "$work/two_hosts.jsonl")
    echo "$comm"
    if echo "$comm" | grep -q "\(all_gather\|reshard\)[^\"]*replica"; then
      echo "FAIL: a gather runs over 'replica' (across the hosts)"
      exit 1
    fi
    echo "$comm" | grep -q "\"all_gather 'fsdp'\"" || { echo "FAIL: no all_gather over 'fsdp'"; exit 1; }
    echo "$comm" | grep -q "\"psum ('replica','fsdp')\"" || { echo "FAIL: no gradient sum over ('replica','fsdp')"; exit 1; }
    echo "scale: FSDP + remat + micro-batches on a hybrid mesh across 2 hosts, under a 4 MiB budget per rank, give the losses of one unlimited rank"
    ;;
  separate)
    if MN_TIMEOUT=60 across vader,self -n 4 --map-by node "$build/apps/shard_info" > "$work/out.txt" 2>&1; then
      cat "$work/out.txt"
      echo "FAIL: the job ran with only shared memory between the hosts"
      exit 1
    fi
    grep -m1 "unable to reach each other" "$work/out.txt" ||
      { cat "$work/out.txt"; echo "FAIL: no 'unable to reach each other' message"; exit 1; }
    echo "separate: with btl vader,self the hosts cannot reach each other, as expected"
    ;;
  killed)
    # A harness run in its own process group, killed with -9 once training runs on node1:
    # its trap never runs, so namespaces and processes are left behind.
    # Its temporary directory goes inside ours, so that it too is removed.
    TMPDIR=$work MN_TRAIN_STEPS=1000000 setsid "$here/run.sh" train "$build" > "$work/first.txt" 2>&1 &
    first=$!
    for _ in $(seq 300); do
      if pids=$(ip netns pids "$(mn_ns node1)" 2>/dev/null) && [ -n "$pids" ] &&
        ps -o args= -p "$(echo "$pids" | tr '\n' ',' | sed 's/,$//')" | grep -q train_mlp; then
        break
      fi
      sleep 0.1
    done
    kill -9 "$first"
    wait "$first" || true
    echo "killed the first run (pid $first) in training: it left $(ip netns list | grep -c "^${MN_PREFIX}-")" \
      "namespaces and $(ip netns pids "$(mn_ns node1)" | wc -l) processes on node1"
    "$here/run.sh" collectives "$build"
    echo "killed: a run right after a kill -9 passed"
    ;;
  slurm)
    chmod a+x "$work"  # munged's socket is below it (slurm.sh)
    if ! slurm_start "$work/slurm" 2; then
      slurm_logs
      echo "FAIL: Slurm did not start on the hosts"
      exit 1
    fi
    mn_exec node0 sinfo -N
    # srun's MPI plugins; Debian's Slurm has pmix (PMIx 4, as Debian's Open MPI) and pmi2.
    if ! mn_exec node0 srun --mpi=list 2>&1 | grep -qw pmix; then
      echo "SKIP: this Slurm has no mpi/pmix plugin (srun --mpi=list)"
      exit 77
    fi
    across tcp,vader,self -n 4 --map-by node "$build/apps/train_gpt" "${gpt_model[@]}" --mesh data=2,model=2 \
      > "$work/mpirun.jsonl"
    # slurm_job LAUNCHER: the example batch job, train_gpt on 2 nodes x 2 tasks x 1 CPU (so
    # 1 device per rank and the mesh data=2,model=2 of the mpirun run), submitted from node0,
    # given 120 s to end. NET_IF keeps MPI on the hosts' subnet (as across does). Both
    # launchers work here:
    # - srun --mpi=pmix: Debian's Open MPI has only PMIx (pmix ext3x, on the system's PMIx 4) and
    #   no PMI-1/PMI-2 component, Debian's Slurm has mpi/pmix_v4 on the same library. Without
    #   --mpi=pmix (MpiDefault=none) each rank stops in MPI_Init: "OMPI was not built with
    #   SLURM's PMI support".
    # - mpirun in the allocation: Open MPI (built --with-slurm) reads the nodes from the job and
    #   starts its daemon on the other node with srun (plm slurm); there is no ssh here.
    slurm_job() {
      local launcher=$1 t0=$SECONDS job
      if ! job=$(mn_exec node0 env APP=train_gpt LAUNCHER="$launcher" SHARD_DIR="$root" \
        SHARD_BUILD_DIR="$build" NET_IF="$net" \
        sbatch --parsable --nodes=2 --ntasks-per-node=2 --cpus-per-task=1 --time=5 \
        --output="$work/job-$launcher.out" "$root/mpirun_examples/slurm_train.sbatch" "${gpt_model[@]}"); then
        slurm_logs
        echo "FAIL: sbatch did not take the job"
        exit 1
      fi
      echo "submitted job $job with LAUNCHER=$launcher"
      if ! slurm_wait "$job" 120; then
        echo "---- the job's output ($work/job-$launcher.out)"
        cat "$work/job-$launcher.out" 2>/dev/null || true
        slurm_logs
        echo "FAIL: the Slurm job with LAUNCHER=$launcher failed or did not end in 120 s"
        exit 1
      fi
      echo "job $job with LAUNCHER=$launcher: submitted and ended in $((SECONDS - t0)) s"
    }
    for launcher in srun mpirun; do
      MIN_BYTES=50000 crossed - slurm_job "$launcher"
      grep -m1 '^slurm_train:' "$work/job-$launcher.out"
      grep -q '"ranks": 4,.*"mesh": "data=2,model=2"' "$work/job-$launcher.out" ||
        { cat "$work/job-$launcher.out"; echo "FAIL: the job did not run 4 ranks with the mesh data=2,model=2"; exit 1; }
      # The same devices in the same mesh on the same hosts (make_mesh orders them by host, however
      # the launcher numbered the ranks), the same algorithms: bit-identical losses.
      $python "$here/../train/compare.py" identical "$work/mpirun.jsonl" "$work/job-$launcher.out" ||
        { echo "FAIL: the job with LAUNCHER=$launcher did not give mpirun's losses"; exit 1; }
    done
    echo "slurm: sbatch slurm_train.sbatch (train_gpt, 2 hosts x 2 ranks) gives mpirun's losses with srun --mpi=pmix and with mpirun in the allocation"
    ;;
  *)
    echo "unknown case $case" >&2
    exit 2
    ;;
esac
