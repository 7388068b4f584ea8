#pragma once
/// \file Compatibility: the header moved to shard/ops/matmul.hpp (its layer's folder); include that, or
/// shard/shard.hpp.
#include "shard/ops/matmul.hpp"
