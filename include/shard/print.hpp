#pragma once
/// \file Compatibility: the header moved to shard/array/print.hpp (its layer's folder); include that, or
/// shard/shard.hpp.
#include "shard/array/print.hpp"
