#pragma once
/// \file Compatibility: the header moved to shard/core/dtype.hpp (its layer's folder); include that, or
/// shard/shard.hpp.
#include "shard/core/dtype.hpp"
