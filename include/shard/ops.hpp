#pragma once
/// \file Whole-array operations that run where the shards are ("computation follows data"):
/// elementwise arithmetic with numpy broadcasting, unary maps, comparisons and where,
/// reductions, transpose and astype. Each op inserts only the communication the layouts need.
///
/// Sharding rule for two operands (document of record): the result takes the sharding of the
/// first operand whose shape is the result's shape (the second's if only it has it). The other
/// operand is resharded, if needed, to the matching layout: the result's spec on its
/// non-broadcast dims, None on its broadcast (size-1 or missing) dims. So `batch + bias` with
/// batch P('data', 'model') slices a replicated bias to P('model') locally, and two arrays of
/// one shape with different shardings move the second to the first's. Both must live on the
/// same mesh (same devices in the same order): otherwise MeshMismatchError names both lists.

#include <cstdint>
#include <vector>

#include "shard/reshard.hpp"
#include "shard/sharded_array.hpp"

namespace shard {

enum class BinaryOp { kAdd, kSub, kMul, kDiv, kMax, kMin };
enum class CompareOp { kLess, kLessEqual, kGreater, kGreaterEqual, kEqual, kNotEqual };
enum class UnaryOp { kExp, kLog, kSin, kCos, kTanh, kRelu, kSqrt, kAbs, kNeg, kSquare };

/// numpy's broadcast of two shapes; throws ShapeError naming both when they do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b);

/// Collective over all ranks when a reshard is needed, local otherwise.
template <typename T>
ShardedArray<T> binary(const ShardedArray<T>& a, const ShardedArray<T>& b, BinaryOp op);
/// Local: `a op scalar` (scalar_first: `scalar op a`).
template <typename T>
ShardedArray<T> binary(const ShardedArray<T>& a, T scalar, BinaryOp op, bool scalar_first = false);
/// alpha*x + y in one pass over memory, broadcast and sharded like binary(); local unless it must reshard.
template <typename T>
ShardedArray<T> axpy(T alpha, const ShardedArray<T>& x, const ShardedArray<T>& y);
/// Local: an elementwise function.
template <typename T>
ShardedArray<T> unary(const ShardedArray<T>& a, UnaryOp op);
/// Like binary(): 1 where the comparison holds, else 0.
template <typename T>
ShardedArray<std::int32_t> compare(const ShardedArray<T>& a, const ShardedArray<T>& b, CompareOp op);
template <typename T>
ShardedArray<std::int32_t> compare(const ShardedArray<T>& a, T scalar, CompareOp op);
/// cond ? a : b elementwise (cond non-zero), broadcasting all three; the result takes the
/// sharding of the first of a, b, cond whose shape is the result's (else a's entries on its
/// non-broadcast dims).
template <typename T>
ShardedArray<T> where(const ShardedArray<std::int32_t>& cond, const ShardedArray<T>& a, const ShardedArray<T>& b);

/// Local: fn applied to every element (any callable T -> T).
template <typename T, typename F>
ShardedArray<T> map(const ShardedArray<T>& a, F&& fn) {
  std::vector<Shard<T>> shards;
  for (const auto& s : a.addressable_shards()) {
    Tensor<T> out(s.data.shape());
    const T* in = s.data.data();
    T* o = out.data();
    for (std::int64_t i = 0; i < out.size(); ++i) o[i] = fn(in[i]);
    shards.push_back(Shard<T>{s.device, s.box, std::move(out)});
  }
  return ShardedArray<T>(a.shape(), a.sharding(), std::move(shards));
}

template <typename T> ShardedArray<T> operator+(const ShardedArray<T>& a, const ShardedArray<T>& b) { return binary(a, b, BinaryOp::kAdd); }
template <typename T> ShardedArray<T> operator-(const ShardedArray<T>& a, const ShardedArray<T>& b) { return binary(a, b, BinaryOp::kSub); }
template <typename T> ShardedArray<T> operator*(const ShardedArray<T>& a, const ShardedArray<T>& b) { return binary(a, b, BinaryOp::kMul); }
template <typename T> ShardedArray<T> operator/(const ShardedArray<T>& a, const ShardedArray<T>& b) { return binary(a, b, BinaryOp::kDiv); }
template <typename T> ShardedArray<T> operator+(const ShardedArray<T>& a, T s) { return binary(a, s, BinaryOp::kAdd); }
template <typename T> ShardedArray<T> operator-(const ShardedArray<T>& a, T s) { return binary(a, s, BinaryOp::kSub); }
template <typename T> ShardedArray<T> operator*(const ShardedArray<T>& a, T s) { return binary(a, s, BinaryOp::kMul); }
template <typename T> ShardedArray<T> operator/(const ShardedArray<T>& a, T s) { return binary(a, s, BinaryOp::kDiv); }
template <typename T> ShardedArray<T> operator+(T s, const ShardedArray<T>& a) { return binary(a, s, BinaryOp::kAdd, true); }
template <typename T> ShardedArray<T> operator-(T s, const ShardedArray<T>& a) { return binary(a, s, BinaryOp::kSub, true); }
template <typename T> ShardedArray<T> operator*(T s, const ShardedArray<T>& a) { return binary(a, s, BinaryOp::kMul, true); }
template <typename T> ShardedArray<T> operator/(T s, const ShardedArray<T>& a) { return binary(a, s, BinaryOp::kDiv, true); }
template <typename T> ShardedArray<T> operator-(const ShardedArray<T>& a) { return unary(a, UnaryOp::kNeg); }

template <typename T> ShardedArray<T> exp(const ShardedArray<T>& a) { return unary(a, UnaryOp::kExp); }
template <typename T> ShardedArray<T> log(const ShardedArray<T>& a) { return unary(a, UnaryOp::kLog); }
template <typename T> ShardedArray<T> sin(const ShardedArray<T>& a) { return unary(a, UnaryOp::kSin); }
template <typename T> ShardedArray<T> cos(const ShardedArray<T>& a) { return unary(a, UnaryOp::kCos); }
template <typename T> ShardedArray<T> tanh(const ShardedArray<T>& a) { return unary(a, UnaryOp::kTanh); }
template <typename T> ShardedArray<T> relu(const ShardedArray<T>& a) { return unary(a, UnaryOp::kRelu); }
template <typename T> ShardedArray<T> sqrt(const ShardedArray<T>& a) { return unary(a, UnaryOp::kSqrt); }
template <typename T> ShardedArray<T> abs(const ShardedArray<T>& a) { return unary(a, UnaryOp::kAbs); }
template <typename T> ShardedArray<T> neg(const ShardedArray<T>& a) { return unary(a, UnaryOp::kNeg); }
template <typename T> ShardedArray<T> square(const ShardedArray<T>& a) { return unary(a, UnaryOp::kSquare); }
template <typename T> ShardedArray<T> maximum(const ShardedArray<T>& a, const ShardedArray<T>& b) { return binary(a, b, BinaryOp::kMax); }
template <typename T> ShardedArray<T> minimum(const ShardedArray<T>& a, const ShardedArray<T>& b) { return binary(a, b, BinaryOp::kMin); }

enum class ReduceKind { kSum, kMean, kMax, kMin };

/// Collective over the mesh axes that split the reduced dims (none: local). Reduces `dims`
/// (all dims when empty; negative dims count from the end); the result's spec drops them.
/// Integer means divide with truncation.
template <typename T>
ShardedArray<T> reduce(const ShardedArray<T>& a, ReduceKind kind, std::vector<int> dims = {});
template <typename T> ShardedArray<T> sum(const ShardedArray<T>& a, std::vector<int> dims = {}) { return reduce(a, ReduceKind::kSum, std::move(dims)); }
template <typename T> ShardedArray<T> mean(const ShardedArray<T>& a, std::vector<int> dims = {}) { return reduce(a, ReduceKind::kMean, std::move(dims)); }
template <typename T> ShardedArray<T> max(const ShardedArray<T>& a, std::vector<int> dims = {}) { return reduce(a, ReduceKind::kMax, std::move(dims)); }
template <typename T> ShardedArray<T> min(const ShardedArray<T>& a, std::vector<int> dims = {}) { return reduce(a, ReduceKind::kMin, std::move(dims)); }
/// The global index of the first maximum along `dim` (numpy's argmax). Two collectives
/// (pmax of the values, pmin of the indices) over the axes that split `dim`.
template <typename T>
ShardedArray<std::int64_t> argmax(const ShardedArray<T>& a, int dim);

/// Local: permutes the dims (reverses them when perm is empty); the spec entries move with
/// their dims, so no data moves between devices.
template <typename T>
ShardedArray<T> transpose(const ShardedArray<T>& a, std::vector<int> perm = {});
/// Local: converts every element.
template <typename U, typename T>
ShardedArray<U> astype(const ShardedArray<T>& a) {
  std::vector<Shard<U>> shards;
  for (const auto& s : a.addressable_shards()) {
    Tensor<U> out(s.data.shape());
    for (std::int64_t i = 0; i < out.size(); ++i) out[i] = static_cast<U>(s.data[i]);
    shards.push_back(Shard<U>{s.device, s.box, std::move(out)});
  }
  return ShardedArray<U>(a.shape(), a.sharding(), std::move(shards));
}

}  // namespace shard
