#pragma once
/// \file What an array carries while autodiff records (internals of autodiff.hpp): the tape it
/// was recorded on, the mesh axes it varies over inside a shard_map body (JAX's "vma"), and
/// its node in the tape when it is differentiable. Arrays made while no tape records carry
/// nothing (a null pointer: no cost).

#include <cstdint>
#include <memory>

namespace shard::detail {

struct NodeBase;

struct AdValue {
  std::uint64_t tape = 0;          ///< the id of the tape (ids are never reused)
  std::uint32_t vma = 0;           ///< mesh axes (bit mask) the value varies over; device tapes only
  std::shared_ptr<NodeBase> node;  ///< null: a constant that only carries its vma
};

}  // namespace shard::detail
