#pragma once
/// \file Compatibility: the header moved to shard/core/index.hpp (its layer's folder); include that, or
/// shard/shard.hpp.
#include "shard/core/index.hpp"
