#pragma once
/// \file Compatibility: the header moved to shard/sharding/partition_spec.hpp (its layer's folder); include
/// that, or shard/shard.hpp.
#include "shard/sharding/partition_spec.hpp"
