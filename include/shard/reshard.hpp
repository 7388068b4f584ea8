#pragma once
/// \file Compatibility: the header moved to shard/array/reshard.hpp (its layer's folder); include that, or
/// shard/shard.hpp.
#include "shard/array/reshard.hpp"
