// Elementwise ops on ShardedArrays: pick the result sharding (ops.hpp's rule), line the
// operands up with it (a reshard only where an operand's layout differs), then run the Tensor
// kernel of the same name on each device's blocks. Nothing else communicates.

#include <algorithm>
#include <optional>

#include "ops/ops_internal.hpp"
#include "shard/core/trace.hpp"
#include "shard/error.hpp"

namespace shard {

namespace detail {

NamedSharding result_sharding(const std::vector<OperandLayout>& operands, const Shape& out_shape) {
  for (bool committed_only : {true, false})
    for (const auto& o : operands)
      if (*o.shape == out_shape && (o.committed || !committed_only)) return *o.sharding;
  // No operand has the full shape: the first committed one's entries on its non-broadcast dims.
  const OperandLayout* base = &operands.front();
  for (const auto& o : operands)
    if (o.committed) {
      base = &o;
      break;
    }
  std::vector<SpecEntry> entries(out_shape.size());
  const Shape& s = *base->shape;
  const std::size_t lead = out_shape.size() - s.size();
  for (std::size_t k = 0; k < s.size(); ++k)
    if (s[k] == out_shape[k + lead]) entries[k + lead] = base->sharding->spec()[static_cast<int>(k)];
  return NamedSharding(base->sharding->mesh(), PartitionSpec(std::move(entries)));
}

NamedSharding matching_sharding(const NamedSharding& out, const Shape& out_shape, const Shape& shape) {
  const std::size_t lead = out_shape.size() - shape.size();
  if (lead == 0 && shape == out_shape) return out;
  std::vector<SpecEntry> entries;
  for (std::size_t k = 0; k < shape.size(); ++k) {
    const bool broadcast = shape[k] != out_shape[k + lead];
    entries.push_back(broadcast ? SpecEntry() : out.spec()[static_cast<int>(k + lead)]);
  }
  return NamedSharding(out.mesh(), PartitionSpec(std::move(entries)));
}

SpecEntry axes_of_dims(const NamedSharding& s, const std::vector<int>& dims) {
  std::vector<std::string> names;
  for (const auto& n : s.mesh().axis_names())
    for (int d : dims)
      for (const auto& a : s.spec()[d].axes())
        if (a == n) names.push_back(n);
  return SpecEntry(names);
}

/// A tracked Tensor lifted to a ShardedArray: its cotangent is the (replicated) array's, which
/// every rank holds.
template <Dtype T, typename Kernel>
ShardedArray<T> record_uncommitted(Tape& tape, const Tensor<T>& x, const Mesh&, Kernel kernel) {
  Tensor<T> operand;  // x's record only: the kernel may move x's storage away
  operand.set_ad(x.ad());
  const Shape shape = x.shape();
  ShardedArray<T> out = paused(kernel);
  for (auto& s : out.addressable_shards()) s.data.set_ad(nullptr);
  KernelVjp<ShardedArray<T>, Tensor<T>> vjp = [shape](const ShardedArray<T>& ct, const std::vector<bool>&) {
    const auto& shards = ct.addressable_shards();
    return std::vector<std::optional<Tensor<T>>>{shards.empty() ? Tensor<T>(shape, T(0)) : shards.front().data.alias()};
  };
  return record_vjp<ShardedArray<T>, Tensor<T>>(tape, "uncommitted", std::move(out), {&operand}, std::move(vjp));
}

template <Dtype T>
ShardedArray<T> uncommitted(const Tensor<T>& x, const Mesh& mesh) {
  if (auto* tape = recording_tape_for(x)) return record_uncommitted(*tape, x, mesh, [&] { return uncommitted(x, mesh); });
  std::vector<Shard<T>> shards;
  for (int d : mesh.local_device_ids())
    shards.push_back(Shard<T>{d, full_box(x.shape()), Tensor<T>::borrow(const_cast<T*>(x.data()), x.shape())});
  return ShardedArray<T>(x.shape(), NamedSharding(mesh, PartitionSpec()), std::move(shards), false);
}

template <Dtype T>
ShardedArray<T> uncommitted(Tensor<T>&& x, const Mesh& mesh) {
  if (auto* tape = recording_tape_for(x))
    return record_uncommitted(*tape, x, mesh, [&] {
      Tensor<T> own = std::move(x);
      own.set_ad(nullptr);
      return uncommitted(std::move(own), mesh);
    });
  std::vector<Shard<T>> shards;
  for (int d : mesh.local_device_ids()) {
    Tensor<T> data = shards.empty() ? std::move(x) : Tensor<T>::borrow(shards.front().data.data(), shards.front().data.shape());
    shards.push_back(Shard<T>{d, full_box(data.shape()), std::move(data)});
  }
  const Shape shape = shards.empty() ? x.shape() : shards.front().data.shape();
  return ShardedArray<T>(shape, NamedSharding(mesh, PartitionSpec()), std::move(shards), false);
}

template <Dtype T>
ShardedArray<T> scalar_on(T v, const Mesh& mesh) {
  std::vector<Shard<T>> shards;
  for (int d : mesh.local_device_ids()) shards.push_back(Shard<T>{d, Box{}, Tensor<T>(Shape{}, v)});
  return ShardedArray<T>(Shape{}, NamedSharding(mesh, PartitionSpec()), std::move(shards), false);
}

}  // namespace detail

namespace {

/// Runs `block_op(blocks...)` on every device's blocks of the operands lined up with the
/// result of an elementwise op over them.
template <typename R, typename... T, typename F>
ShardedArray<R> elementwise(const char* what, F&& block_op, const ShardedArray<T>&... xs) {
  const auto& first = std::get<0>(std::forward_as_tuple(xs...));
  (detail::check_same_devices(first.mesh(), xs.mesh(), what), ...);
  Shape out_shape;
  ((out_shape = broadcast_shapes(out_shape, xs.shape())), ...);
  const NamedSharding out = detail::result_sharding({detail::layout_of(xs)...}, out_shape);
  std::tuple<std::optional<ShardedArray<T>>...> keep;
  return std::apply(
      [&](auto&... k) {
        const auto lined = std::forward_as_tuple(
            detail::lined_up(xs, detail::matching_sharding(out, out_shape, xs.shape()), k)...);
        std::vector<Tensor<R>> blocks;
        const std::size_t n = std::get<0>(lined).addressable_shards().size();
        for (std::size_t i = 0; i < n; ++i)
          blocks.push_back(std::apply([&](const auto&... l) { return block_op(l.addressable_shards()[i].data...); },
                                      lined));
        return detail::assemble(out_shape, out, std::move(blocks));
      },
      keep);
}

/// Runs a local op on every block; the result keeps the sharding.
template <typename R, typename T, typename F>
ShardedArray<R> per_block(const ShardedArray<T>& a, F&& f) {
  std::vector<Shard<R>> shards;
  for (const auto& s : a.addressable_shards()) shards.push_back(Shard<R>{s.device, s.box, f(s.data)});
  return ShardedArray<R>(a.shape(), a.sharding(), std::move(shards));
}

}  // namespace

template <Dtype T>
ShardedArray<T> binary(const ShardedArray<T>& a, const ShardedArray<T>& b, BinaryOp op) {
  if (auto* tape = detail::recording_tape_for(a, b)) return detail::record_binary(*tape, a, b, op);
  return elementwise<T>(
      "binary op", [op](const Tensor<T>& x, const Tensor<T>& y) { return binary(x, y, op); }, a, b);
}

template <Dtype T>
ShardedArray<T> binary(const ShardedArray<T>& a, T s, BinaryOp op, bool scalar_first) {
  if (auto* tape = detail::recording_tape_for(a)) return detail::record_binary_scalar(*tape, a, s, op, scalar_first);
  return per_block<T>(a, [&](const Tensor<T>& x) { return binary(x, s, op, scalar_first); });
}

template <Dtype T>
ShardedArray<bool> compare(const ShardedArray<T>& a, const ShardedArray<T>& b, CompareOp op) {
  if (auto* tape = detail::recording_tape_for(a, b)) return detail::record_compare(*tape, a, b, op);
  return elementwise<bool>(
      "comparison", [op](const Tensor<T>& x, const Tensor<T>& y) { return compare(x, y, op); }, a, b);
}

template <Dtype T>
ShardedArray<bool> compare(const ShardedArray<T>& a, T s, CompareOp op, bool scalar_first) {
  if (auto* tape = detail::recording_tape_for(a)) return detail::record_compare_scalar(*tape, a, s, op, scalar_first);
  return per_block<bool>(a, [&](const Tensor<T>& x) { return compare(x, s, op, scalar_first); });
}

template <Dtype T>
ShardedArray<T> unary(const ShardedArray<T>& a, UnaryOp op) {
  if (auto* tape = detail::recording_tape_for(a)) return detail::record_unary(*tape, a, op);
  return per_block<T>(a, [&](const Tensor<T>& x) { return unary(x, op); });
}

template <Dtype T>
ShardedArray<T> where(const ShardedArray<bool>& cond, const ShardedArray<T>& a, const ShardedArray<T>& b) {
  if (auto* tape = detail::recording_tape_for(cond, a, b)) return detail::record_where(*tape, cond, a, b);
  // The result follows a, then b, then cond (the rule's operand order), so the values decide.
  return elementwise<T>(
      "where",
      [](const Tensor<T>& x, const Tensor<T>& y, const Tensor<bool>& c) { return where(c, x, y); }, a, b, cond);
}

namespace {

/// z = alpha * x + y over n contiguous elements: one read of x and y, one write of z.
template <typename T>
void axpy_contiguous(std::int64_t n, T alpha, const T* __restrict x, const T* __restrict y, T* __restrict z) {
  for (std::int64_t k = 0; k < n; ++k) z[k] = static_cast<T>(alpha * x[k] + y[k]);
}

}  // namespace

template <Dtype T>
ShardedArray<T> axpy(T alpha, const ShardedArray<T>& x, const ShardedArray<T>& y) {
  if (auto* tape = detail::recording_tape_for(x, y)) return detail::record_axpy(*tape, alpha, x, y);
  return elementwise<T>(
      "axpy",
      [alpha](const Tensor<T>& bx, const Tensor<T>& by) {
        if (bx.shape() == by.shape()) {
          Tensor<T> z(bx.shape());
          axpy_contiguous(z.size(), alpha, bx.data(), by.data(), z.data());
          return z;
        }
        return binary(binary(bx, alpha, BinaryOp::kMul, true), by, BinaryOp::kAdd);
      },
      x, y);
}

#define SHARD_INSTANTIATE_OPS(T)                                                                             \
  template ShardedArray<T> detail::uncommitted<T>(const Tensor<T>&, const Mesh&);                            \
  template ShardedArray<T> detail::uncommitted<T>(Tensor<T>&&, const Mesh&);                                 \
  template ShardedArray<T> detail::scalar_on<T>(T, const Mesh&);                                             \
  template ShardedArray<T> binary<T>(const ShardedArray<T>&, const ShardedArray<T>&, BinaryOp);              \
  template ShardedArray<T> binary<T>(const ShardedArray<T>&, T, BinaryOp, bool);                             \
  template ShardedArray<bool> compare<T>(const ShardedArray<T>&, const ShardedArray<T>&, CompareOp);         \
  template ShardedArray<bool> compare<T>(const ShardedArray<T>&, T, CompareOp, bool);                        \
  template ShardedArray<T> unary<T>(const ShardedArray<T>&, UnaryOp);                                        \
  template ShardedArray<T> where<T>(const ShardedArray<bool>&, const ShardedArray<T>&, const ShardedArray<T>&);
SHARD_FOR_EACH_DTYPE(SHARD_INSTANTIATE_OPS)
#undef SHARD_INSTANTIATE_OPS
#define SHARD_INSTANTIATE_AXPY(T) \
  template ShardedArray<T> axpy<T>(T, const ShardedArray<T>&, const ShardedArray<T>&);
SHARD_FOR_EACH_NUMERIC_DTYPE(SHARD_INSTANTIATE_AXPY)
#undef SHARD_INSTANTIATE_AXPY

}  // namespace shard
