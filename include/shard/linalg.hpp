#pragma once
/// \file Compatibility: the header moved to shard/linalg/linalg.hpp (its layer's folder); include that, or
/// shard/shard.hpp.
#include "shard/linalg/linalg.hpp"
#include "shard/ops/matmul.hpp"  // the flat linalg.hpp declared matmul too
