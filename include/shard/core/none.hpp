#pragma once
/// \file Python's None as a value: an unsharded dim in a PartitionSpec (`P("a", None)`), an
/// open slice bound (`Slice(None, None, 2)`), a broadcast argument of pmap.

namespace shard {

/// The placeholder None: `P("a", None)`, `Slice(None, 8)`.
struct NoneType {
  constexpr bool operator==(const NoneType&) const = default;
};
inline constexpr NoneType None{};

}  // namespace shard
