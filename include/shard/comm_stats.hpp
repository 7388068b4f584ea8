#pragma once
/// \file Compatibility: the header moved to shard/comm/comm_stats.hpp (its layer's folder); include that, or
/// shard/shard.hpp.
#include "shard/comm/comm_stats.hpp"
