#pragma once
/// \file Compatibility: the header moved to shard/sharding/positional_sharding.hpp (its layer's folder);
/// include that, or shard/shard.hpp.
#include "shard/sharding/positional_sharding.hpp"
