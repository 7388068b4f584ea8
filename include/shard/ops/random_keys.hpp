#pragma once
/// \file Arrays of random keys (jax.random's key data), so that a vmapped function draws with
/// its own key per example, as `jax.vmap(lambda k: jax.random.normal(k, shape))(jax.random.split(key, n))`:
///
///   const Tensor<std::int64_t> keys = random::split_keys(random::key(0), 8);   // (8, 2)
///   Tensor<float> draws = vmap([](const Tensor<std::int64_t>& k) { return random::normal<float>(k,
///   Shape{3}); })(keys);
///   // draws[j] == random::normal_box<float>(random::split(random::key(0), 8)[j], {3}, full_box({3}))
///
/// A key's data is its two uint32 words (hi, lo), held in int64 (Shard has no uint32 dtype). The
/// draws from key data are a primitive (prim::RandomDraw) whose kernel draws once per key of a
/// (..., 2) array of keys, so its batching rule is the same draw on the batch of keys.

#include <cstdint>
#include <source_location>

#include "shard/array/driver.hpp"
#include "shard/array/random.hpp"
#include "shard/core/primitive.hpp"
#include "shard/core/tensor.hpp"
#include "shard/error.hpp"
#include "shard/ops/batching.hpp"

namespace shard::random {

/// jax.random.key_data(k): (hi, lo) as a (2,) array.
inline Tensor<std::int64_t> key_data(Key k) {
  return Tensor<std::int64_t>(Shape{2}, std::vector<std::int64_t>{k.hi, k.lo});
}
/// jax.random.split(k, n) as key data: (n, 2), row j the key data of split(k, n)[j].
inline Tensor<std::int64_t> split_keys(Key k, std::int64_t n) {
  if (n < 0) raise<ValueError>("random::split_keys: n must be >= 0, got ", n);
  Tensor<std::int64_t> out(Shape{n, 2});
  for (std::int64_t j = 0; j < n; ++j) {
    const Key s = fold_in(k, static_cast<std::uint32_t>(j));  // split(k, n)[j]
    out.flat(2 * j) = s.hi;
    out.flat(2 * j + 1) = s.lo;
  }
  return out;
}

}  // namespace shard::random

namespace shard::prim {

/// Draws of `shape` from each key of a (..., 2) array of key data: the result is
/// keys.shape[:-1] + shape, block j the draw of key j (uniform in [lo, hi) or normal).
template <Dtype T>
struct RandomDraw : Primitive {
  Shape shape;
  bool normal = false;
  T lo = T(0), hi = T(1);
  static constexpr bool kernel_validates = true;
  const char* name() const { return normal ? "random_normal" : "random_uniform"; }
  Tensor<T> kernel(const Tensor<std::int64_t>& keys) const {
    if (keys.ndim() == 0 || keys.shape().back() != 2)
      raise<ShapeError>(name(), ": a key is (2,) key data (random::key_data, random::split_keys); got shape ",
                        to_string(keys.shape()));
    Shape out_shape(keys.shape().begin(), keys.shape().end() - 1);
    const std::int64_t n = num_elements(out_shape);
    out_shape.insert(out_shape.end(), shape.begin(), shape.end());
    Tensor<T> out(out_shape);
    const std::int64_t block = num_elements(shape);
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t h = keys.flat(2 * j), l = keys.flat(2 * j + 1);
      if (h < 0 || l < 0 || h > 0xffffffffLL || l > 0xffffffffLL)
        raise<ValueError>(name(), ": key data holds two uint32 words; got (", h, ", ", l, ")");
      const random::Key k{static_cast<std::uint32_t>(h), static_cast<std::uint32_t>(l)};
      const Tensor<T> d = normal ? random::normal_box<T>(k, shape, full_box(shape))
                                 : random::uniform_box<T>(k, shape, full_box(shape), lo, hi);
      std::copy(d.begin(), d.end(), out.begin() + j * block);
    }
    return out;
  }
  /// Batching: the same draw for the batch of keys (each example's key draws its own block).
  BatchOut<Tensor<T>> batch(const shard::source_location& where, std::int64_t,
                            const BatchArg<Tensor<std::int64_t>>& keys) const {
    return {detail::bind_at(*this, where, detail::batch_first(keys)), 0};
  }
};

}  // namespace shard::prim

namespace shard::random {

/// jax.random.uniform(key, shape, T, lo, hi) from key data (2,) (one draw) or (..., 2) (one per key).
template <Dtype T>
Tensor<T> uniform(const Tensor<std::int64_t>& key, const Shape& shape, T lo = T(0), T hi = T(1),
                  shard::source_location where = shard::source_location::current()) {
  const detail::CallScope scope("random::uniform", where);
  return detail::bind_at(prim::RandomDraw<T>{{}, shape, false, lo, hi}, where, key);
}
/// jax.random.normal(key, shape, T) from key data (2,) (one draw) or (..., 2) (one per key).
template <Dtype T>
Tensor<T> normal(const Tensor<std::int64_t>& key, const Shape& shape,
                 shard::source_location where = shard::source_location::current()) {
  const detail::CallScope scope("random::normal", where);
  return detail::bind_at(prim::RandomDraw<T>{{}, shape, true, T(0), T(1)}, where, key);
}

}  // namespace shard::random
