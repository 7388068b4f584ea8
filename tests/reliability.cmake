# Reliability: an error on any rank ends the whole job with "[rank r] error: ..." and a
# non-zero code (never a hang); SHARD_CHECK_COLLECTIVES catches ranks that issue different
# collectives; SHARD_COLLECTIVE_TIMEOUT aborts a collective some rank never reaches, naming
# it; a training run killed with -9 resumes from its last checkpoint.

shard_mpi_test_binary(test_reliability mpi/test_reliability.cpp)
shard_add_mpi_test(test_reliability RANKS 1 2 3 DEVICES 1 2 TIMEOUT 60)

add_executable(fault_injection mpi/fault_injection.cpp)
target_link_libraries(fault_injection PRIVATE shard::shard shard_warnings)

set(_rel_fail ${CMAKE_CURRENT_SOURCE_DIR}/expect_failure.sh)
# shard_reliability_test(<name> <devices per rank> <timeout> <extra env> <regexes> <mode>):
# <regexes> is a list; the output must match each (e.g. one per rank's error line).
function(shard_reliability_test name k timeout env regexes mode)
  set(_e)
  foreach(r IN LISTS regexes)
    list(APPEND _e -e "${r}")
  endforeach()
  add_test(NAME reliability.${name}.np2.dpr${k}
           COMMAND ${_rel_fail} ${_e}
                   ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${SHARD_MPIEXEC_FLAGS} $<TARGET_FILE:fault_injection> ${mode})
  set_tests_properties(reliability.${name}.np2.dpr${k} PROPERTIES TIMEOUT ${timeout} LABELS "mpi;reliability"
    ENVIRONMENT "${SHARD_MPI_TEST_ENV};SHARD_DEVICES_PER_RANK=${k};${env}")
endfunction()

foreach(k 1 2)
  # The program itself works (every collective kind, with the check and under the watchdog).
  add_test(NAME reliability.ok.np2.dpr${k}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${SHARD_MPIEXEC_FLAGS} $<TARGET_FILE:fault_injection> ok)
  set_tests_properties(reliability.ok.np2.dpr${k} PROPERTIES TIMEOUT 60 LABELS "mpi;reliability"
    ENVIRONMENT "${SHARD_MPI_TEST_ENV};SHARD_DEVICES_PER_RANK=${k};SHARD_COLLECTIVE_TIMEOUT=30"
    PASS_REGULAR_EXPRESSION "fault_injection ok: 2 ranks x ${k} devices")
  # Rank 1's body throws while rank 0 waits in the psum: rank 1 announces its error, rank 0
  # (polling its psum under SHARD_CHECK_COLLECTIVES) raises it, both print and exit 1.
  shard_reliability_test(throw_in_psum ${k} 40 "SHARD_ABORT_GRACE=20"
    "\\[rank 1\\] error: injected failure on rank 1 inside shard_map, before its psum;\\[rank 0\\] error: rank 1 failed: injected failure on rank 1 inside shard_map, before its psum \\(this rank learned of it waiting in psum over 'a' of float64"
    throw_in_psum)
  # Without the check rank 0 waits in a blocking psum: rank 1 aborts the job after the grace.
  shard_reliability_test(throw_in_psum_unchecked ${k} 40 "SHARD_ABORT_GRACE=3;SHARD_CHECK_COLLECTIVES=0"
    "\\[rank 1\\] error: injected failure on rank 1 inside shard_map, before its psum;\\[rank 1\\] error: the other ranks did not reach the end of shard_map within 3 s"
    throw_in_psum)
  # Ranks call psum over different axes (different group communicators): the check names both sites.
  shard_reliability_test(axes_mismatch ${k} 40 "SHARD_CHECK_COLLECTIVES=1"
    "\\[rank [01]\\] error: collective mismatch on mesh .*rank 0 called psum over 'a' .*fault_injection.cpp:[0-9]+.*but rank 1 called psum over 'b' .*fault_injection.cpp:[0-9]+"
    axes_mismatch)
  # Rank 1 sleeps 30 s before the psum: the watchdog on rank 0 aborts after 2 s, naming rank 1.
  shard_reliability_test(watchdog ${k} 25 "SHARD_COLLECTIVE_TIMEOUT=2"
    "\\[rank 0\\] error: collective watchdog: psum over 'a' .*did not complete within 2 s.*rank 1 had not arrived"
    sleep)
endforeach()
# A worker device thread (device 1 of rank 0) throws inside shard_map.
shard_reliability_test(device_throw 2 40 "SHARD_ABORT_GRACE=20"
  "\\[rank 0\\] error: injected failure on device 1 \\(rank 0, thread 1\\) inside shard_map;\\[rank 1\\] error: rank 0 failed: injected failure on device 1"
  device_throw)
# psum on one rank, pmax on the other over the same axis: a wrong result without the check.
shard_reliability_test(op_mismatch 1 40 "SHARD_CHECK_COLLECTIVES=1"
  "error: collective mismatch .*rank 0 called psum over 'a' .*but rank 1 called pmax over 'a'" op_mismatch)
# An exception in application code on rank 1 while rank 0 waits in an array-level psum.
# Rank 0 raises rank 1's error (both lines, exit 1); without the check the job is aborted
# after the grace with rank 1's line.
shard_reliability_test(app_throw 1 40 "SHARD_ABORT_GRACE=20"
  "\\[rank 1\\] error: injected failure in application code on rank 1;\\[rank 0\\] error: rank 1 failed: injected failure in application code on rank 1"
  app_throw)
shard_reliability_test(app_throw_unchecked 1 40 "SHARD_ABORT_GRACE=3;SHARD_CHECK_COLLECTIVES=0"
  "\\[rank 1\\] error: injected failure in application code on rank 1" app_throw)

# Default settings (no SHARD_* variable): a mismatched collective never returns wrong data
# and never hangs; every rank prints the error and the job exits non-zero within seconds.
function(shard_default_settings_test name k timeout regexes mode)
  set(_e)
  foreach(r IN LISTS regexes)
    list(APPEND _e -e "${r}")
  endforeach()
  add_test(NAME reliability.default.${name}.np2.dpr${k}
           COMMAND ${_rel_fail} ${_e} env -u SHARD_CHECK_COLLECTIVES -u SHARD_COLLECTIVE_TIMEOUT -u SHARD_ABORT_GRACE
                   ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${SHARD_MPIEXEC_FLAGS} $<TARGET_FILE:fault_injection> ${mode})
  set_tests_properties(reliability.default.${name}.np2.dpr${k} PROPERTIES TIMEOUT ${timeout} LABELS "mpi;reliability"
    ENVIRONMENT "${SHARD_MPI_TEST_ENV};SHARD_DEVICES_PER_RANK=${k}")
endfunction()
foreach(k 1 2)
  shard_default_settings_test(op_mismatch ${k} 30
    "\\[rank 0\\] error: collective mismatch on mesh .*rank 0 called psum over 'a' .*but rank 1 called pmax over 'a';\\[rank 1\\] error: collective mismatch"
    op_mismatch)
  shard_default_settings_test(kind_mismatch ${k} 30
    "\\[rank 0\\] error: collective mismatch on mesh .*rank 0 called psum over 'a' .*but rank 1 called all_gather over 'a';\\[rank 1\\] error: collective mismatch"
    kind_mismatch)
  shard_default_settings_test(shape_mismatch ${k} 30
    "\\[rank 0\\] error: collective mismatch on mesh .*rank 0 called psum over 'a' of float64\\(2, 3\\).*but rank 1 called psum over 'a' of float64\\(1, 3\\);\\[rank 1\\] error: collective mismatch"
    shape_mismatch)
  shard_default_settings_test(axes_mismatch ${k} 30
    "\\[rank [01]\\] error: collective mismatch on mesh .*rank 0 called psum over 'a' .*but rank 1 called psum over 'b'"
    axes_mismatch)
  shard_default_settings_test(skip ${k} 30
    "\\[rank 0\\] error: collective mismatch: rank 0 called the end of the program .*but rank 1 called psum over 'a';\\[rank 1\\] error: collective mismatch on mesh .*rank 0 called the end of the program"
    skip)
  shard_default_settings_test(early_return ${k} 30
    "\\[rank 0\\] error: collective mismatch on mesh .*rank 0 called psum over 'a' .*but rank 1 called the end of shard_map;\\[rank 1\\] error: collective mismatch.*rank 0 called psum over 'a'"
    early_return)
  shard_default_settings_test(app_throw ${k} 30
    "\\[rank 1\\] error: injected failure in application code on rank 1;\\[rank 0\\] error: rank 1 failed: injected failure in application code on rank 1"
    app_throw)
  # Each rank prints its own error (rank 0's body, rank 1's application code); no MPI_Abort.
  shard_default_settings_test(both_throw ${k} 30
    "\\[rank 0\\] error: injected failure in rank 0's shard_map body;\\[rank 1\\] error: injected failure in application code on rank 1"
    both_throw)
  shard_default_settings_test(watch ${k} 30
    "\\[rank 0\\] error: collective watchdog: psum over 'a' of float64\\(4, 3\\) \\(MPI_Allreduce \\(the collective check\\) on ranks 0, 1\\) has not completed after 2 s"
    watch)
endforeach()

# The nonblocking (watchdog) forms of every collective give the same results as the blocking ones.
foreach(t test_collectives test_reliability)
  foreach(k 1 2)
    add_test(NAME ${t}.watchdog.np2.dpr${k}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${SHARD_MPIEXEC_FLAGS} $<TARGET_FILE:${t}>)
    set_tests_properties(${t}.watchdog.np2.dpr${k} PROPERTIES TIMEOUT 300 LABELS "mpi;reliability"
      ENVIRONMENT "${SHARD_MPI_TEST_ENV};SHARD_DEVICES_PER_RANK=${k};SHARD_COLLECTIVE_TIMEOUT=60")
  endforeach()
endforeach()

# kill -9 of one rank of train_mlp: mpirun ends within 10 s, the last checkpoint resumes.
if(SHARD_BUILD_APPS)
  add_test(NAME reliability.kill_train
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/reliability/kill_train.sh $<TARGET_FILE:train_mlp> ${MPIEXEC_EXECUTABLE})
  set_tests_properties(reliability.kill_train PROPERTIES TIMEOUT 120 LABELS "mpi;app;reliability"
    ENVIRONMENT "${SHARD_MPI_TEST_ENV}")
endif()
