#pragma once
/// \file Compatibility: the header moved to shard/core/array_ops.hpp (its layer's folder); include that, or
/// shard/shard.hpp.
#include "shard/core/array_ops.hpp"
#include "shard/ops/nn.hpp"  // the composites (softmax, gelu, ...) were in array_ops.hpp
