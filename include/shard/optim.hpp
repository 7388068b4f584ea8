#pragma once
/// \file Compatibility: the header moved to shard/train/optim.hpp (its layer's folder); include that, or
/// shard/shard.hpp.
#include "shard/train/optim.hpp"
