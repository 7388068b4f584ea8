#pragma once
/// \file Compatibility: the header moved to shard/runtime/runtime.hpp (its layer's folder); include that, or
/// shard/shard.hpp.
#include "shard/runtime/runtime.hpp"
