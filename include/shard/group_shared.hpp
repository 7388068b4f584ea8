#pragma once
/// \file Compatibility: the header moved to shard/comm/group_shared.hpp (its layer's folder); include that,
/// or shard/shard.hpp.
#include "shard/comm/group_shared.hpp"
