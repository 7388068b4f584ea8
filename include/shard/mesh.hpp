#pragma once
/// \file Compatibility: the header moved to shard/sharding/mesh.hpp (its layer's folder); include that, or
/// shard/shard.hpp.
#include "shard/sharding/mesh.hpp"
