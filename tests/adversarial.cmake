# Adversarial inputs (label "adversarial"): one case per class of failure an adversarial pass
# found. Each runs at 2 ranks and passes only if the job exits non-zero with the message
# (tests/expect_failure.sh) within 10 s (the TIMEOUT). The regexes match "[rank 1] error:"
# where every rank must report the error itself.
if(SHARD_BUILD_APPS)
  set(_adv_fail ${CMAKE_CURRENT_SOURCE_DIR}/expect_failure.sh)
  set(_adv_run ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${SHARD_MPIEXEC_FLAGS})
  set(_adv_cases ${CMAKE_CURRENT_SOURCE_DIR}/adversarial/train_cases.sh)

  # shard_adversarial(<name> <regexes> COMMAND...): <regexes> is a list, each must match.
  function(shard_adversarial name regexes)
    set(_e)
    foreach(r IN LISTS regexes)
      list(APPEND _e -e "${r}")
    endforeach()
    add_test(NAME adversarial.${name} COMMAND ${_adv_fail} ${_e} ${ARGN})
    set_tests_properties(adversarial.${name} PROPERTIES TIMEOUT 10 LABELS "mpi;adversarial"
                         ENVIRONMENT "${SHARD_MPI_TEST_ENV}")
  endfunction()

  # Data that does not fit the model: a test set of 28x29 images, an empty test set.
  shard_adversarial(train_test_shape
    "rank 1. error: --layers starts with 784 and ends with 10 but the test set has 812 inputs and 10 outputs;rank 0. error: --layers starts with 784 and ends with 10 but the test set has 812 inputs and 10 outputs"
    ${_adv_cases} test_shape $<TARGET_FILE:train_mlp> ${_adv_run})
  shard_adversarial(train_test_empty "rank 1. error: the test set has no rows;rank 0. error: the test set has no rows"
    ${_adv_cases} test_empty $<TARGET_FILE:train_mlp> ${_adv_run})
  # Flags: a non-finite float, an axis given twice.
  shard_adversarial(train_weight_decay_inf "rank 1. error: --weight-decay must be a finite number in .0, 1e.06., got inf;rank 0. error: --weight-decay must be a finite number"
    ${_adv_run} $<TARGET_FILE:train_mlp> --dataset synthetic --layers 16,8,4 --epochs 1 --weight-decay inf)
  shard_adversarial(train_mesh_twice "rank 1. error: bad --mesh 'data=2,data=1': 'data' is given twice;rank 0. error: bad --mesh 'data=2,data=1': 'data' is given twice"
    ${_adv_run} $<TARGET_FILE:train_mlp> --dataset synthetic --layers 16,8,4 --epochs 1 --mesh data=2,data=1)
  # A damaged manifest: optimizer_step "abc".
  shard_adversarial(train_manifest_step
    "rank 1. error: checkpoint of step [0-9]+: metadata 'optimizer_step' is 'abc', not an integer;rank 0. error: checkpoint of step [0-9]+: metadata 'optimizer_step' is 'abc', not an integer"
    ${_adv_cases} manifest_step $<TARGET_FILE:train_mlp> ${_adv_run})
  # Divergence: stops with the step and keeps the last good checkpoint (checked by the script).
  shard_adversarial(train_diverges "rank 1. error: training diverged: the loss is inf at step 2;rank 0. error: training diverged: the loss is inf at step 2"
    ${_adv_cases} diverge $<TARGET_FILE:train_mlp> ${_adv_run})
  # A throw that is not a std::exception on one rank: one clear line, and rank 0 (waiting in a
  # psum) raises it too.
  shard_adversarial(throw_int
    "rank 1. error: the program threw an exception that is not a std::exception;rank 0. error: rank 1 failed: an exception that is not a std::exception"
    ${_adv_run} $<TARGET_FILE:fault_injection> throw_int)
  # Host arrays of different ndim passed to device_put: the error on every rank.
  shard_adversarial(device_put_ndim
    "rank 1. error: NamedSharding: P.'a', None. has 2 entries but the array of shape .[0-9]+,. has only 1 dims;rank 0. error: rank 1 failed: NamedSharding: P.'a', None. has 2 entries"
    ${_adv_run} $<TARGET_FILE:fault_injection> device_put_ndim)
  # An allocation that fails on one rank (2^60 bytes): the sizes on that rank and on the one waiting for it.
  shard_adversarial(alloc_fail
    "rank 1. error: cannot allocate 1152921504606846976 bytes for a float32.288230376151711744,. array on this rank;rank 0. error: rank 1 failed: cannot allocate 1152921504606846976 bytes for a float32.288230376151711744,. array .*waiting in psum over 'a'"
    ${_adv_run} $<TARGET_FILE:fault_injection> alloc_fail)
  # An MPI call that fails on one rank only: the routine and the MPI message on both ranks.
  shard_adversarial(mpi_error
    "rank 1. error: MPI_Bcast failed: .*MPI error code;rank 0. error: rank 1 failed: MPI_Bcast failed: "
    ${_adv_run} $<TARGET_FILE:fault_injection> mpi_error)
  # std::exit(0) on one rank while the other waits for it in a psum: one line, the job ends.
  shard_adversarial(exit_on_one_rank
    "rank 1. error: exit.. was called on this rank while the shard::Runtime was running"
    ${_adv_run} $<TARGET_FILE:fault_injection> exit_one)
  # A checkpoint where rank 1 records one more array than rank 0: agreed before any file is
  # written, the error on every rank (it used to wait in different collectives until the watchdog).
  shard_adversarial(checkpoint_commit_mismatch
    "rank 1. error: CheckpointWriter::commit: this rank commits 2 arrays where rank 0 commits 1 arrays;rank 0. error: rank 1 failed: CheckpointWriter::commit"
    ${_adv_run} $<TARGET_FILE:fault_injection> checkpoint_mismatch)
  # A corpus whose validation split is smaller than one batch of windows: refused before training.
  shard_adversarial(gpt_small_validation
    "rank 1. error: the validation split .67 bytes. holds fewer than --batch 4 windows of 64 tokens;rank 0. error: the validation split"
    ${_adv_cases} gpt_small_validation $<TARGET_FILE:train_gpt> ${_adv_run})
  # A model far beyond the node's memory: refused before anything is allocated.
  shard_adversarial(gpt_model_too_big
    "rank 1. error: the model .layers=1000000000.* needs at least .* GiB per rank;rank 0. error: the model"
    ${_adv_run} $<TARGET_FILE:train_gpt> --layers 1000000000 --warmup 1 --steps 2)
  # The fault hook's sweep (SHARD_FAULT_COLLECTIVE): rank 1 of a train_gpt run (one step and a
  # checkpoint save) diverges at its k-th checked collective, one more collective (extra) or
  # another one (rename); every run ends in a collective mismatch on both ranks within 10 s.
  # A fixed-seed sample of positions; every position with SHARD_FULL_MATRIX=1 (CI's slow tier).
  foreach(mode extra rename)
    add_test(NAME adversarial.fault_sweep.${mode}
             COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/adversarial/fault_sweep.sh $<TARGET_FILE:train_gpt>
                     ${MPIEXEC_EXECUTABLE} ${mode})
    set_tests_properties(adversarial.fault_sweep.${mode} PROPERTIES TIMEOUT 1800 LABELS "mpi;adversarial"
                         ENVIRONMENT "${SHARD_MPI_TEST_ENV}")
  endforeach()
  # The fault hook refuses settings that could never fire, and every rank must have the same.
  shard_adversarial(env_fault_hook_rank
    "rank 1. error: SHARD_FAULT_COLLECTIVE='extra:3:5': rank 5 is not in this job of 2 ranks;rank 0. error: SHARD_FAULT_COLLECTIVE='extra:3:5'"
    ${CMAKE_COMMAND} -E env SHARD_FAULT_COLLECTIVE=extra:3:5 ${_adv_run} $<TARGET_FILE:shard_info>)
  shard_adversarial(env_fault_hook_never_fired
    "rank 1. error: SHARD_FAULT_COLLECTIVE=extra:999999 never fired: this rank checked [0-9]+ collectives"
    ${CMAKE_COMMAND} -E env SHARD_FAULT_COLLECTIVE=extra:999999 ${_adv_run} $<TARGET_FILE:shard_info>)
  shard_adversarial(env_fault_hook_differs
    "rank 1. error: SHARD_FAULT_COLLECTIVE differs between the ranks;rank 0. error: SHARD_FAULT_COLLECTIVE differs"
    ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 1 ${SHARD_MPIEXEC_FLAGS} ${CMAKE_COMMAND} -E env SHARD_FAULT_COLLECTIVE=count
    $<TARGET_FILE:shard_info> : ${MPIEXEC_NUMPROC_FLAG} 1 $<TARGET_FILE:shard_info>)
  # Ranks started with different flags (mpirun's MPMD form): refused before anything runs.
  shard_adversarial(gpt_flags_differ
    "rank 1. error: rank 1 was started with other flags than rank 0: '--lr 0.5 --steps 2';rank 0. error: .*rank 1 was started with other flags than rank 0"
    ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 1 ${SHARD_MPIEXEC_FLAGS} $<TARGET_FILE:train_gpt> --lr 0.001 --steps 2
    : ${MPIEXEC_NUMPROC_FLAG} 1 $<TARGET_FILE:train_gpt> --lr 0.5 --steps 2)
  # A checkpoint directory that is a file: refused before the first step (it failed after training).
  shard_adversarial(gpt_checkpoint_dir_is_a_file
    "rank 1. error: .*--checkpoint-dir /dev/null is not a directory;rank 0. error: --checkpoint-dir /dev/null is not a directory"
    ${_adv_run} $<TARGET_FILE:train_gpt> --layers 1 --d-model 16 --heads 2 --context 8 --batch 4 --steps 2
    --warmup 0 --checkpoint-dir /dev/null)
  shard_adversarial(env_fault_hook
    "rank 1. error: SHARD_FAULT_COLLECTIVE='extra:0': expected count, extra:K.:RANK. or rename:K.:RANK. .K >= 1.;rank 0. error: SHARD_FAULT_COLLECTIVE='extra:0'"
    ${CMAKE_COMMAND} -E env SHARD_FAULT_COLLECTIVE=extra:0 ${_adv_run} $<TARGET_FILE:shard_info>)
  # Environment variables, one per kind of value (flag, seconds, integer): every rank names it.
  shard_adversarial(env_flag
    "rank 1. error: SHARD_CHECK_COLLECTIVES must be 1 or 0 .on/off, true/false, yes/no., got 'maybe';rank 0. error: SHARD_CHECK_COLLECTIVES must be 1 or 0"
    ${CMAKE_COMMAND} -E env SHARD_CHECK_COLLECTIVES=maybe ${_adv_run} $<TARGET_FILE:shard_info>)
  shard_adversarial(env_seconds
    "rank 1. error: SHARD_ABORT_GRACE must be a number of seconds in .0, 1e.06., got 'inf';rank 0. error: SHARD_ABORT_GRACE must be"
    ${CMAKE_COMMAND} -E env SHARD_ABORT_GRACE=inf ${_adv_run} $<TARGET_FILE:shard_info>)
  shard_adversarial(env_integer
    "rank 1. error: SHARD_DEVICES_PER_RANK must be an integer in .1, 4096., got '2x';rank 0. error: SHARD_DEVICES_PER_RANK must be"
    ${CMAKE_COMMAND} -E env SHARD_DEVICES_PER_RANK=2x ${_adv_run} $<TARGET_FILE:shard_info>)
endif()
