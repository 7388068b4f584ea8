#pragma once
/// \file Compatibility: the header moved to shard/io/io.hpp (its layer's folder); include that, or
/// shard/shard.hpp.
#include "shard/io/io.hpp"
