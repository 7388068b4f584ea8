#pragma once
/// \file Compatibility: the header moved to shard/array/sharded_array.hpp (its layer's folder); include that,
/// or shard/shard.hpp.
#include "shard/array/sharded_array.hpp"
