# The shell scripts (label "scripts"), included from tests/CMakeLists.txt:
#   scripts.lint              bash -n and shellcheck on every script, found when the test runs
#                             (tests/lint_scripts.sh); needs shellcheck (cmake/install-deps.sh)
#   scripts.hostfile_example  mpirun_examples/hostfile_example.sh really launches: a localhost
#                             hostfile, 2 ranks x 2 devices, mesh data=2,model=2, 5 tiny steps
#   scripts.hostfile_example_gpt  the same with APP=train_gpt (a tiny transformer, 3 steps)
#   scripts.mpi_layer         no MPI call outside the comm layer (tests/check_mpi_layer.sh)
#   scripts.dtype_list        the dtype list is written once (tests/check_dtype_list.sh)
#   scripts.format            C++ files follow .clang-format (tests/check_format.sh)
#   scripts.docs              README.md and docs/ keep true: links, named scripts and apps, the API
#                             tables' shard:: names, the README's first program (tests/check_docs.sh)
#   scripts.batching_rules    every primitive of the op table has a batching rule (vmap)
#                             (tests/check_batching_rules.py)
#   scripts.layers            includes point down the layers, no library file past 700 lines, no
#                             build outputs tracked (tests/check_layers.sh)

add_test(NAME scripts.lint COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/lint_scripts.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(scripts.lint PROPERTIES TIMEOUT 60 LABELS scripts)

if(TARGET train_mlp)
  set(_shard_hostfile ${CMAKE_CURRENT_BINARY_DIR}/hosts.localhost)
  file(WRITE ${_shard_hostfile} "# written by tests/scripts.cmake for scripts.hostfile_example\nlocalhost slots=2\n")
  # One core per rank (CPUS_PER_RANK=1); a machine with one core cannot bind two ranks apart.
  cmake_host_system_information(RESULT _shard_cores QUERY NUMBER_OF_PHYSICAL_CORES)
  set(_shard_oversubscribe 0)
  if(_shard_cores LESS 2)
    set(_shard_oversubscribe 1)
  endif()
  add_test(NAME scripts.hostfile_example
           COMMAND ${PROJECT_SOURCE_DIR}/mpirun_examples/hostfile_example.sh
                   --dataset synthetic --layers 32,16,8 --samples 128 --batch 32 --log-every 1)
  set_tests_properties(scripts.hostfile_example PROPERTIES TIMEOUT 120 LABELS scripts
    ENVIRONMENT "${SHARD_MPI_TEST_ENV};HOSTFILE=${_shard_hostfile};TRAIN_MLP=$<TARGET_FILE:train_mlp>;SHARD_BUILD_DIR=${CMAKE_BINARY_DIR};RANKS_PER_NODE=2;DEVICES_PER_RANK=2;MODEL=2;CPUS_PER_RANK=1;OVERSUBSCRIBE=${_shard_oversubscribe};MAX_STEPS=5"
    # (a PASS regex alone would ignore the exit code: mpirun's report of a failed rank fails it)
    PASS_REGULAR_EXPRESSION "mesh data=2,model=2.*Mesh\\('data': 2, 'model': 2\\).*done: 5 steps"
    FAIL_REGULAR_EXPRESSION "returned a non-zero exit code|exited on signal|error:")
endif()
if(TARGET train_gpt)
  add_test(NAME scripts.hostfile_example_gpt
           COMMAND ${PROJECT_SOURCE_DIR}/mpirun_examples/hostfile_example.sh
                   --layers 1 --d-model 16 --heads 2 --context 8 --batch 4 --steps 10 --warmup 1 --val-windows 8)
  set_tests_properties(scripts.hostfile_example_gpt PROPERTIES TIMEOUT 120 LABELS scripts
    ENVIRONMENT "${SHARD_MPI_TEST_ENV};APP=train_gpt;HOSTFILE=${_shard_hostfile};TRAIN_MLP=$<TARGET_FILE:train_gpt>;SHARD_BUILD_DIR=${CMAKE_BINARY_DIR};RANKS_PER_NODE=2;DEVICES_PER_RANK=2;MODEL=2;CPUS_PER_RANK=1;OVERSUBSCRIBE=${_shard_oversubscribe};MAX_STEPS=3"
    PASS_REGULAR_EXPRESSION "mesh data=2,model=2.*Mesh\\('data': 2, 'model': 2\\).*done: 3 steps"
    FAIL_REGULAR_EXPRESSION "returned a non-zero exit code|exited on signal|error:")
endif()

# scripts.mpi_layer: no MPI call outside the comm layer beyond the listed files (a ratchet,
# tests/check_mpi_layer.sh; issue 19 moves the rest).
add_test(NAME scripts.mpi_layer COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/check_mpi_layer.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(scripts.mpi_layer PROPERTIES TIMEOUT 30 LABELS scripts)

# scripts.dtype_list: the dtype list is written once, SHARD_DTYPE_TABLE in include/shard/core/dtype.hpp;
# no other file of src/ or include/ instantiates a template for several dtypes by hand or spells
# dtype names / .npy codes (tests/check_dtype_list.sh).
add_test(NAME scripts.dtype_list COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/check_dtype_list.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(scripts.dtype_list PROPERTIES TIMEOUT 30 LABELS scripts)

# scripts.layers: DESIGN.md's layer folders: an include that climbs the layer order and is not
# listed in tests/layers_pending.txt (a ratchet: the list only shrinks), a library file past 700
# lines or a tracked build output fails (tests/check_layers.sh).
add_test(NAME scripts.docs COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/check_docs.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(scripts.docs PROPERTIES TIMEOUT 60 LABELS scripts)

# Every primitive of the op table has a batching rule (vmap): tests/check_batching_rules.py.
add_test(NAME scripts.batching_rules COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/check_batching_rules.py
                                              ${PROJECT_SOURCE_DIR})
set_tests_properties(scripts.batching_rules PROPERTIES TIMEOUT 30 LABELS scripts)

add_test(NAME scripts.layers COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/check_layers.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(scripts.layers PROPERTIES TIMEOUT 30 LABELS scripts)

# scripts.format: C++ files follow .clang-format; the files written before the check are listed
# in tests/format_pending.txt until a change formats them (tests/check_format.sh).
add_test(NAME scripts.format COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/check_format.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(scripts.format PROPERTIES TIMEOUT 120 LABELS scripts SKIP_RETURN_CODE 77)
