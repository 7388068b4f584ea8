#pragma once
// A branch-free exp and a contiguous softmax row for tensor_rows.cpp and tensor_attention.cpp
// (internal).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <type_traits>

namespace shard::detail {

/// e^d for d <= 0 (a softmax's logits after subtracting the row's max), within 1 ulp of
/// exp: Cephes' expf after range reduction (n = round(d log2 e) by the 1.5 * 2^23 trick,
/// 2^n from n's bits), branch-free so the row loop vectorizes; 0 below -87.3 (and for -inf,
/// the causal mask), nan for nan. Doubles use std::exp.
template <typename T>
inline T exp_nonpositive(T d) {
  if constexpr (std::is_same_v<T, float>) {
    const float x = std::max(d, -87.3f);
    const float t = x * 1.44269504088896341f + 12582912.0f;
    const float n = t - 12582912.0f;
    const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * (r * r) + r + 1.0f;
    std::uint32_t bits;
    std::memcpy(&bits, &t, sizeof bits);
    const std::uint32_t scale_bits = (bits - 0x4B400000u + 127u) << 23;
    float scale;
    std::memcpy(&scale, &scale_bits, sizeof scale);
    const float e = y * scale;
    return d < -87.3f ? 0.0f : e;
  } else {
    return std::exp(d);
  }
}

/// One row's softmax, contiguous (stride 1: the loops vectorize); out may be in.
template <typename T>
void softmax_row(const T* in, T* out, std::int64_t n) {
  T m = in[0];  // a nan anywhere in the row makes the sum, and so every output, nan
  for (std::int64_t i = 1; i < n; ++i) m = std::max(m, in[i]);
  for (std::int64_t i = 0; i < n; ++i) out[i] = exp_nonpositive(in[i] - m);
  double sum = 0;
  for (std::int64_t i = 0; i < n; ++i) sum += out[i];
  const T inv = static_cast<T>(1.0 / sum);
  for (std::int64_t i = 0; i < n; ++i) out[i] *= inv;
}

}  // namespace shard::detail
