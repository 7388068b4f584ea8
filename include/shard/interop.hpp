#pragma once
/// \file Compatibility: the header moved to shard/spmd/interop.hpp (its layer's folder); include that, or
/// shard/shard.hpp.
#include "shard/spmd/interop.hpp"
