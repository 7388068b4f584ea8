#pragma once
/// \file Compatibility: the header moved to shard/spmd/shard_map.hpp (its layer's folder); include that, or
/// shard/shard.hpp.
#include "shard/spmd/shard_map.hpp"
