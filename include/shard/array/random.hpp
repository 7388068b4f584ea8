#pragma once
/// \file Partitionable, counter-based random numbers: jax.random with the threefry2x32
/// implementation and jax_threefry_partitionable=True (JAX's default). A value is a pure
/// function of (key, global row-major element index), so the same key gives bit-identical
/// arrays on any mesh, rank count, devices per rank or spec. Nothing here communicates.
///
/// Element i of an array hashes the counter (hi32(i), lo32(i)) under the key into two words
/// (y0, y1); 32-bit draws use y0 ^ y1 and 64-bit draws (y0 << 32) | y1, as
/// jax._src.prng._threefry_random_bits_partitionable does. split(k, n)[j] and fold_in(k, j)
/// both hash the counter (0, j). uniform follows jax.random.uniform bit for bit (mantissa
/// bits under the exponent of 1.0, minus 1, times hi - lo, plus lo, max with lo); normal is
/// JAX's sqrt(2) * erfinv(u) with u = uniform in [nextafter(-1, 0), 1) (same u bits as
/// JAX), with an erfinv accurate to 0.5 ulp in float and ~6e-16 in double, so it agrees with
/// JAX's values to a few ulp rather than bit for bit (XLA's float32 erfinv is off by several ulp).
///
/// permutation(k, n) is a Fisher-Yates shuffle whose swap partners are unbiased bounded draws
/// from 64-bit threefry words (counter c for the c-th draw); it throws ValueError for n < 0
/// and does not reproduce JAX's bits (jax.random.permutation sorts by random keys instead).
///
/// The *_box functions generate one box of the global array as a dense tensor; the sharded
/// functions call them once per distinct box of this rank (shard::generate), and with
/// full_box(shape) they give the whole array in one process.

#include <cstdint>
#include <vector>

#include "shard/core/box.hpp"
#include "shard/core/dtype.hpp"
#include "shard/sharding/named_sharding.hpp"
#include "shard/array/sharded_array.hpp"
#include "shard/core/tensor.hpp"

namespace shard::random {

/// A threefry2x32 key: JAX's raw uint32[2] key data (jax.random.key_data), hi first.
struct Key {
  std::uint32_t hi = 0;
  std::uint32_t lo = 0;
  bool operator==(const Key&) const = default;
};

/// jax.random.key(seed) / PRNGKey(seed), i.e. {seed >> 32, seed & 0xffffffff}; no communication.
Key key(std::uint64_t seed);

/// jax.random.split(k, n): key j is threefry2x32(k, (0, j)); no communication.
std::vector<Key> split(Key k, int n = 2);

/// jax.random.fold_in(k, data): threefry2x32(k, (0, data)) = split(k, n)[data]; no communication.
Key fold_in(Key k, std::uint32_t data);

/// Threefry-2x32 with 20 rounds (Random123, JAX's threefry2x32_p): (x0, x1) -> (y0, y1); no communication.
void threefry2x32(Key k, std::uint32_t x0, std::uint32_t x1, std::uint32_t& y0, std::uint32_t& y1);

/// jax.random.uniform(k, shape, T, lo, hi), T float or double, laid out by `s`; no communication.
template <typename T>
ShardedArray<T> uniform(Key k, const Shape& shape, const NamedSharding& s, T lo = 0, T hi = 1);

/// Standard normals, JAX's sqrt(2) * erfinv(uniform in (-1, 1)), laid out by `s`; no communication.
template <typename T>
ShardedArray<T> normal(Key k, const Shape& shape, const NamedSharding& s);

/// 0/1 values, 1 where a float64 uniform in [0, 1) is below p (jax.random.bernoulli); no communication.
ShardedArray<std::int32_t> bernoulli(Key k, double p, const Shape& shape, const NamedSharding& s);

/// The uint32 random word of each element (jax.random.bits, dtype uint32), held in int64; no communication.
ShardedArray<std::int64_t> bits(Key k, const Shape& shape, const NamedSharding& s);

/// A uniform random permutation of 0..n-1, identical on every rank; no communication.
Tensor<std::int64_t> permutation(Key k, std::int64_t n);

/// The elements of `box` of uniform(k, global, ...), shape box.extent; no communication.
template <typename T>
Tensor<T> uniform_box(Key k, const Shape& global, const Box& box, T lo = 0, T hi = 1);
/// The elements of `box` of normal(k, global, ...), shape box.extent; no communication.
template <typename T>
Tensor<T> normal_box(Key k, const Shape& global, const Box& box);
/// The elements of `box` of bernoulli(k, p, global, ...), shape box.extent; no communication.
Tensor<std::int32_t> bernoulli_box(Key k, double p, const Shape& global, const Box& box);
/// The elements of `box` of bits(k, global, ...), shape box.extent; no communication.
Tensor<std::int64_t> bits_box(Key k, const Shape& global, const Box& box);

/// Inverse error function (Giles' double polynomials, ~6e-16; +-inf at +-1); no communication.
double erfinv(double x);
/// Inverse error function, the double result rounded once (0.5 ulp); no communication.
float erfinv(float x);

#define SHARD_DECLARE_RANDOM(T)                                                              \
  extern template ShardedArray<T> uniform<T>(Key, const Shape&, const NamedSharding&, T, T); \
  extern template ShardedArray<T> normal<T>(Key, const Shape&, const NamedSharding&);        \
  extern template Tensor<T> uniform_box<T>(Key, const Shape&, const Box&, T, T);             \
  extern template Tensor<T> normal_box<T>(Key, const Shape&, const Box&);
SHARD_FOR_EACH_FLOAT_DTYPE(SHARD_DECLARE_RANDOM)
#undef SHARD_DECLARE_RANDOM

}  // namespace shard::random
