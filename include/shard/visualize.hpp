#pragma once
/// \file Compatibility: the header moved to shard/array/visualize.hpp (its layer's folder); include that, or
/// shard/shard.hpp.
#include "shard/array/visualize.hpp"
