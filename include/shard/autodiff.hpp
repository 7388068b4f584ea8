#pragma once
/// \file Compatibility: the header moved to shard/autodiff/autodiff.hpp (its layer's folder); include that,
/// or shard/shard.hpp.
#include "shard/autodiff/autodiff.hpp"
