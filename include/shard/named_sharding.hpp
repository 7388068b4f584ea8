#pragma once
/// \file Compatibility: the header moved to shard/sharding/named_sharding.hpp (its layer's folder); include
/// that, or shard/shard.hpp.
#include "shard/sharding/named_sharding.hpp"
