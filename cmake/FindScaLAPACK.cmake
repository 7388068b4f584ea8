# FindScaLAPACK
# -------------
# Finds ScaLAPACK built for Open MPI (Debian: libscalapack-openmpi-dev) through pkg-config
# (module scalapack-openmpi, then scalapack), falling back to a plain library search.
#
# Imported target:  ScaLAPACK::ScaLAPACK  (links MPI, LAPACK and BLAS as ScaLAPACK needs)
# Result variables: ScaLAPACK_FOUND, ScaLAPACK_LIBRARIES

find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_search_module(PC_ScaLAPACK QUIET scalapack-openmpi scalapack)
endif()

find_library(ScaLAPACK_LIBRARY
  NAMES scalapack-openmpi scalapack
  HINTS ${PC_ScaLAPACK_LIBRARY_DIRS})

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(ScaLAPACK REQUIRED_VARS ScaLAPACK_LIBRARY)

if(ScaLAPACK_FOUND AND NOT TARGET ScaLAPACK::ScaLAPACK)
  if(NOT TARGET MPI::MPI_C)
    find_package(MPI REQUIRED COMPONENTS C)
  endif()
  find_package(LAPACK REQUIRED)
  add_library(ScaLAPACK::ScaLAPACK UNKNOWN IMPORTED)
  set_target_properties(ScaLAPACK::ScaLAPACK PROPERTIES
    IMPORTED_LOCATION "${ScaLAPACK_LIBRARY}"
    INTERFACE_LINK_LIBRARIES "MPI::MPI_C;LAPACK::LAPACK")
  set(ScaLAPACK_LIBRARIES "${ScaLAPACK_LIBRARY}")
endif()
mark_as_advanced(ScaLAPACK_LIBRARY)
