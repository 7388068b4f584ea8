#pragma once
/// \file Compatibility: the header moved to shard/ops/ops.hpp (its layer's folder); include that, or
/// shard/shard.hpp.
#include "shard/ops/ops.hpp"
