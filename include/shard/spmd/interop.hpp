#pragma once
/// \file Calling MPI yourself next to Shard (interop, like mpi4jax's communicators).

#include <mpi.h>

#include "shard/sharding/mesh.hpp"
#include "shard/spmd/shard_map.hpp"

namespace shard {

/// The MPI communicator Shard's collectives over `axes` of `mesh` use for this rank's group:
/// the ranks holding the group's devices, in the group's order (communicator rank i holds the
/// device at axis index i). For running your own MPI calls (a baseline, a library) on the same
/// ranks; Shard's consistency check, watchdog and CommStats do not see them. Shard owns it (do
/// not free it); valid while the mesh lives.
///
/// Requires one device per rank along those axes: MPI_COMM_NULL when the group lives on this
/// rank only (one rank, or the axes stay inside this rank); ValueError when this rank holds
/// devices of several groups, or several devices of its group (device-level calls then go
/// through shard_map). Collective over the mesh's ranks on the first call for an axis list.
MPI_Comm axis_communicator(const Mesh& mesh, const Axes& axes);

}  // namespace shard
