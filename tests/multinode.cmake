# Multi-node tests: Open MPI jobs across network-namespace "hosts" over TCP (tests/multinode/).
# They need root; elsewhere they report skipped (exit 77) with the reason. One at a time: they
# share the namespace names. multinode.slurm runs mpirun_examples/slurm_train.sbatch under a
# Slurm it starts on the hosts (skipped when Slurm or munge is not installed).
foreach(case collectives train train_gpt scale separate killed slurm)
  add_test(NAME multinode.${case}
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/multinode/run.sh ${case} ${CMAKE_BINARY_DIR})
  set_tests_properties(multinode.${case} PROPERTIES
    LABELS multinode TIMEOUT 180 SKIP_RETURN_CODE 77 RESOURCE_LOCK multinode_netns
    FAIL_REGULAR_EXPRESSION "FAIL:")
endforeach()
# The multi-host benchmark (tests/multinode/bench.sh; README "Multi-host"), in its quick form:
# the unshaped link, 64 KiB collectives and a few training steps, to keep it running.
if(SHARD_BUILD_APPS)
  add_test(NAME multinode.bench_quick
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/multinode/bench.sh ${CMAKE_BINARY_DIR} --quick)
  set_tests_properties(multinode.bench_quick PROPERTIES
    LABELS multinode TIMEOUT 180 SKIP_RETURN_CODE 77 RESOURCE_LOCK multinode_netns
    PASS_REGULAR_EXPRESSION "bench: ran \\(quick\\)")
endif()
