# The installed package, used as a user's project uses it (label `package`). Fixtures:
#   package.clean             removes the previous prefix and consumer builds
#   package.install           cmake --install <build> --prefix <build>/package-prefix
#   package.consumer.build    configures and builds tests/consumer with find_package(Shard)
#                             against that prefix only (CMAKE_PREFIX_PATH), into <build>/consumer-build
#   package.consumer.run      runs it under mpiexec at 2 ranks (1 device each: ScaLAPACK too)
#   package.consumer.detects_mismatch  the same with a corrupted reference must fail
#   package.pkgconfig         mpicxx main.cpp $(pkg-config --cflags --libs shard), 2 ranks x 2 devices
# Needs the library and the apps built (cmake --install installs both).

set(_shard_pkg_prefix ${CMAKE_BINARY_DIR}/package-prefix)
set(_shard_pkg_consumer ${CMAKE_BINARY_DIR}/consumer-build)
set(_shard_pkg_mpiexec ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${SHARD_MPIEXEC_FLAGS} ${MPIEXEC_PREFLAGS})

add_test(NAME package.clean
         COMMAND ${CMAKE_COMMAND} -E rm -rf ${_shard_pkg_prefix} ${_shard_pkg_consumer} ${CMAKE_BINARY_DIR}/consumer-pkgconfig)
set_tests_properties(package.clean PROPERTIES FIXTURES_SETUP shard_package TIMEOUT 30)

add_test(NAME package.install
         COMMAND ${CMAKE_COMMAND} --install ${CMAKE_BINARY_DIR} --prefix ${_shard_pkg_prefix} --config $<CONFIG>)
set_tests_properties(package.install PROPERTIES FIXTURES_SETUP shard_package DEPENDS package.clean TIMEOUT 60)

add_test(NAME package.consumer.build
         COMMAND ${CMAKE_CTEST_COMMAND} --build-and-test ${CMAKE_CURRENT_SOURCE_DIR}/consumer ${_shard_pkg_consumer}
                 --build-generator ${CMAKE_GENERATOR} --build-makeprogram ${CMAKE_MAKE_PROGRAM}
                 --build-options -DCMAKE_PREFIX_PATH=${_shard_pkg_prefix} -DSHARD_EXPECTED_PREFIX=${_shard_pkg_prefix}
                                 -DCMAKE_BUILD_TYPE=$<CONFIG>
                                 -DCMAKE_C_COMPILER=${CMAKE_C_COMPILER} -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}
                                 -DCMAKE_COMPILE_WARNING_AS_ERROR=ON -DCMAKE_EXPORT_COMPILE_COMMANDS=ON)
set_tests_properties(package.consumer.build PROPERTIES
  FIXTURES_REQUIRED shard_package FIXTURES_SETUP shard_consumer TIMEOUT 180)

add_test(NAME package.consumer.run
         COMMAND ${_shard_pkg_mpiexec} ${_shard_pkg_consumer}/consumer ${MPIEXEC_POSTFLAGS} --devices-per-rank 1)
set_tests_properties(package.consumer.run PROPERTIES FIXTURES_REQUIRED shard_consumer TIMEOUT 60
  ENVIRONMENT "${SHARD_MPI_TEST_ENV}"
  PASS_REGULAR_EXPRESSION "1x2 mesh \\(2 ranks x 1 devices\\) match the host reference \\(ScaLAPACK too\\)"
  FAIL_REGULAR_EXPRESSION "error:")

add_test(NAME package.consumer.detects_mismatch
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/expect_failure.sh
                 "rank [01]\\] error: consumer: shard_map psum over 'b' .*differs from the host reference at element \\(0, 0\\)"
                 ${_shard_pkg_mpiexec} ${_shard_pkg_consumer}/consumer ${MPIEXEC_POSTFLAGS} --corrupt-reference)
set_tests_properties(package.consumer.detects_mismatch PROPERTIES FIXTURES_REQUIRED shard_consumer TIMEOUT 60
  ENVIRONMENT "${SHARD_MPI_TEST_ENV}")

add_test(NAME package.pkgconfig
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/consumer/pkgconfig_test.sh ${PKG_CONFIG_EXECUTABLE} ${MPI_CXX_COMPILER}
                 ${_shard_pkg_prefix}/${CMAKE_INSTALL_LIBDIR}/pkgconfig ${CMAKE_BINARY_DIR}/consumer-pkgconfig
                 ${PROJECT_SOURCE_DIR}/include ${_shard_pkg_mpiexec})
set_tests_properties(package.pkgconfig PROPERTIES FIXTURES_REQUIRED shard_package TIMEOUT 180
  ENVIRONMENT "${SHARD_MPI_TEST_ENV}"
  PASS_REGULAR_EXPRESSION "2x2 mesh \\(2 ranks x 2 devices\\) match the host reference"
  FAIL_REGULAR_EXPRESSION "error:")

set_tests_properties(package.clean package.install package.consumer.build package.consumer.run
  package.consumer.detects_mismatch package.pkgconfig PROPERTIES LABELS package)
