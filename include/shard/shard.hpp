#pragma once
/// \file The umbrella header: everything a Shard user needs.

#include "shard/blas.hpp"
#include "shard/box.hpp"
#include "shard/comm_stats.hpp"
#include "shard/device.hpp"
#include "shard/error.hpp"
#include "shard/mesh.hpp"
#include "shard/mpi/agree.hpp"
#include "shard/mpi/communicator.hpp"
#include "shard/named_sharding.hpp"
#include "shard/partition_spec.hpp"
#include "shard/positional_sharding.hpp"
#include "shard/runtime.hpp"
#include "shard/shard_map.hpp"
#include "shard/sharded_array.hpp"
#include "shard/tensor.hpp"
#include "shard/visualize.hpp"
