// Gradient reduction overlapped with the backward pass (ops/detail/grad_reduce.hpp). Layouts, for
// a parameter's gradient C = op(A) @ op(B) whose contraction runs over the mesh axes k:
//   op(A)[rows, k] op(B)[k, cols]             where they lie (the rules' plan needs no reshard)
//   C_partial[r0:r1, cols] = op(A)[r0:r1] @ op(B)   per device, chunk by chunk (OpenBLAS)
//   C[r0:r1, cols] = psum_k(C_partial[r0:r1])       MPI_Iallreduce started after each chunk
// and the chunks in flight are tested between the gemms that follow.

#include "shard/ops/detail/grad_reduce.hpp"

#include <algorithm>
#include <any>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "array/plan_cache.hpp"
#include "comm/collective_shared.hpp"
#include "core/gemm.hpp"
#include "shard/array/sharded_array.hpp"
#include "shard/comm/detail/collective.hpp"
#include "shard/core/tensor_ops.hpp"
#include "shard/error.hpp"
#include "shard/ops/matmul.hpp"

namespace shard {

GradientReduction& gradient_reduction() {
  static GradientReduction settings;
  return settings;
}

namespace detail {

NamedSharding transposed(const NamedSharding& s);  // matmul.cpp

namespace {

/// The reductions in flight of this thread's scope (weak: the parameters' nodes own them).
struct ScopeState {
  int depth = 0;
  std::vector<std::weak_ptr<InFlightReduction>> in_flight;
};
thread_local ScopeState t_scope;

void register_in_flight(const std::shared_ptr<InFlightReduction>& r) { t_scope.in_flight.push_back(r); }

/// Gradient accumulation's state on this thread (AccumulationScope): per deferred reduction of a
/// step, in order, this rank's partial blocks summed over the micro-batches so far.
struct Accumulation {
  int depth = 0;
  int micro = 0, micros = 1;
  std::size_t next = 0;
  std::vector<std::any> sums;  ///< std::vector<Tensor<T>>, one block per local device
};
thread_local Accumulation t_acc;

/// Adds this micro-batch's partial blocks to the step's next sum. Returns the sums (to be
/// reduced) on the last micro-batch, else nothing.
template <Dtype T>
std::optional<std::vector<Tensor<T>>> accumulate(std::vector<Tensor<T>> blocks) {
  Accumulation& a = t_acc;
  const std::size_t slot = a.next++;
  if (a.micro == 0) {
    if (slot != a.sums.size())
      raise<Error>("gradient accumulation: reduction ", slot, " out of order (internal error)");
    for (auto& b : blocks)
      if (!b.unique_storage()) b = Tensor<T>(b);  // summed in place: nothing else may see it
    a.sums.emplace_back(std::move(blocks));
  } else {
    auto* sum = slot < a.sums.size() ? std::any_cast<std::vector<Tensor<T>>>(&a.sums[slot]) : nullptr;
    bool same = sum && sum->size() == blocks.size();
    for (std::size_t i = 0; same && i < blocks.size(); ++i) same = (*sum)[i].shape() == blocks[i].shape();
    if (!same)
      raise<ValueError>(
          "gradient accumulation: micro-batch ", a.micro, " reduces a gradient (", slot,
          " of the step) that micro-batch 0 did not (each micro-batch must run the same program "
          "on arrays of the same shapes)");
    for (std::size_t i = 0; i < blocks.size(); ++i) binary_inplace((*sum)[i], blocks[i], BinaryOp::kAdd);
  }
  if (a.micro + 1 < a.micros) return std::nullopt;
  auto* sum = std::any_cast<std::vector<Tensor<T>>>(&a.sums[slot]);
  return std::move(*sum);
}

/// What a micro-batch but the last gets for a deferred gradient: zeros laid out as `s`.
template <Dtype T>
std::function<ShardedArray<T>()> zeros_for(const NamedSharding& s, const Shape& shape) {
  return [s, shape] { return zeros<T>(shape, s); };
}

/// Rows [q0, q1) of op(a) @ op(b) into the same rows of c (row-major, n columns).
template <Dtype T>
void gemm_rows(const Tensor<T>& a, bool ta, const Tensor<T>& b, bool tb, std::int64_t q0, std::int64_t q1,
               Tensor<T>& c) {
  const std::int64_t m = q1 - q0, n = c.shape()[1], k = ta ? a.shape()[0] : a.shape()[1];
  T* out = c.data() + q0 * n;
  if (m == 0 || n == 0) return;
  if (k == 0) {
    std::fill(out, out + m * n, T(0));
    return;
  }
  const T* ap = ta ? a.data() + q0 : a.data() + q0 * a.shape()[1];
  gemm(ta, tb, m, n, k, ap, a.shape()[1], b.data(), b.shape()[1], out, n);
}

/// A gradient whose chunks are being summed: the blocks (one per local device, as 2-D rows x n)
/// and a handle per chunk. Members in this order so that the handles go before the blocks they
/// write.
template <Dtype T>
class DeferredSum final : public InFlightReduction {
 public:
  DeferredSum(const NamedSharding& s, Shape c_shape, std::vector<int> devices)
      : sharding_(s), c_shape_(std::move(c_shape)), devices_(std::move(devices)) {}

  void progress() override {
    for (auto& c : chunks_)
      if (!c.test()) return;  // one test progresses them all; the rest would not be done either
  }
  ShardedArray<T> take() {
    for (auto& c : chunks_) c.wait();
    chunks_.clear();
    std::vector<Shard<T>> shards;
    for (std::size_t i = 0; i < devices_.size(); ++i) {
      Box box = sharding_.box(devices_[i], c_shape_);
      Tensor<T> block = std::move(blocks_[i]).reshaped(box.extent);
      shards.push_back(Shard<T>{devices_[i], std::move(box), std::move(block)});
    }
    return ShardedArray<T>(c_shape_, sharding_, std::move(shards));
  }

  NamedSharding sharding_;
  Shape c_shape_;
  std::vector<int> devices_;
  std::vector<Tensor<T>> blocks_;
  std::vector<PendingCollective> chunks_;
};

/// Sums d's blocks (rows x n each) over `axes` in buckets of at most bucket_bytes: fill(r0, r1)
/// writes rows [r0, r1) (a product's gemms; nothing for blocks already written), then their
/// psum starts. The one bucketing of both views' gradients.
template <Dtype T, typename Fill>
void sum_in_buckets(DeferredSum<T>& d, const Mesh& mesh, const SpecEntry& axes, std::int64_t rows, std::int64_t n,
                    bool bf16, Fill fill) {
  const GradientReduction& settings = gradient_reduction();
  auto chunk_spec = [&](std::int64_t r0, std::int64_t r1) {
    CollectiveSpec chunk = reduce_spec(mesh, ReduceKind::kSum, axes, Shape{r1 - r0, n});
    chunk.dtype = dtype_name<T>();
    return chunk;
  };
  const std::int64_t row_bytes = std::max<std::int64_t>(1, n * static_cast<std::int64_t>(sizeof(T)));
  const std::int64_t bucket = std::max<std::int64_t>(1, settings.bucket_bytes / row_bytes);
  for (std::int64_t r0 = 0; r0 < rows; r0 += bucket) {
    const std::int64_t r1 = std::min(rows, r0 + bucket);
    fill(r0, r1);
    // The previous chunk's second phase (bfloat16) starts here, at the same point on every rank.
    if (!d.chunks_.empty()) d.chunks_.back().post_next_phase();
    d.chunks_.push_back(start_psum_rows(mesh, chunk_spec(r0, r1), d.devices_, d.blocks_, r0, r1, bf16));
    if (!settings.overlap) d.chunks_.back().wait();
  }
  if (rows == 0)  // no rows: still one (empty) sum, so every rank makes the same calls
    d.chunks_.push_back(start_psum_rows(mesh, chunk_spec(0, 0), d.devices_, d.blocks_, 0, 0, bf16));
}

}  // namespace

DeferredReductionScope::DeferredReductionScope() { ++t_scope.depth; }
DeferredReductionScope::~DeferredReductionScope() {
  if (--t_scope.depth == 0) t_scope.in_flight.clear();
}

AccumulationScope::AccumulationScope() : outermost_(t_acc.depth++ == 0) {
  if (outermost_) {
    t_acc = Accumulation();
    t_acc.depth = 1;
  }
}
AccumulationScope::~AccumulationScope() {
  if (--t_acc.depth == 0) t_acc.sums.clear();
}
void AccumulationScope::begin(int i, int k) {
  if (!outermost_) return;  // an accumulation inside another's micro-batch: part of the outer one
  if (i > 0) finish();
  t_acc.micro = i;
  t_acc.micros = k;
  t_acc.next = 0;
}
void AccumulationScope::finish() const {
  if (outermost_ && t_acc.next != t_acc.sums.size())
    raise<ValueError>("gradient accumulation: micro-batch ", t_acc.micro, " reduced ", t_acc.next,
                      " parameter gradients where micro-batch 0 reduced ", t_acc.sums.size(),
                      " (each micro-batch must run the same program on arrays of the same shapes)");
}

void progress_reductions() {
  auto& v = t_scope.in_flight;
  std::erase_if(v, [](const std::weak_ptr<InFlightReduction>& w) { return w.expired(); });
  for (auto& w : v)
    if (auto r = w.lock()) r->progress();
}

template <Dtype T>
std::function<ShardedArray<T>()> matmul_t_deferred(const ShardedArray<T>& a, bool ta, const ShardedArray<T>& b,
                                                   bool tb, const NamedSharding& out) {
  if constexpr (std::is_same_v<T, bfloat16>) return {};  // the product's own psum (float32 accumulation)
  if (t_scope.depth == 0 || a.ndim() != 2 || b.ndim() != 2 || !(a.mesh() == b.mesh())) return {};
  const NamedSharding sa = ta ? transposed(a.sharding()) : a.sharding();
  const NamedSharding sb = tb ? transposed(b.sharding()) : b.sharding();
  const Shape as = ta ? Shape{a.shape()[1], a.shape()[0]} : a.shape();
  const Shape bs = tb ? Shape{b.shape()[1], b.shape()[0]} : b.shape();
  if (as[1] != bs[0] || choose_algorithm(as, sa, bs, sb) != Algorithm::kRules) return {};
  const auto plan = cached_plan_matmul(as, sa, bs, sb, sizeof(T));
  const MatmulPlan& p = *plan;
  const Mesh& mesh = a.mesh();
  if (!(p.a == sa.spec()) || !(p.b == sb.spec()) || p.contract.is_none()) return {};
  const NamedSharding natural(mesh, p.out);
  const Shape c_shape{as[0], bs[1]};
  if (!(out == natural) || c_shape[0] % natural.num_parts(0) != 0 || c_shape[1] % natural.num_parts(1) != 0)
    return {};  // every device's block has the same shape, so every group's chunks match
  const Shape block = natural.shard_shape(c_shape);
  const std::int64_t n = block[1];
  CollectiveSpec whole = reduce_spec(mesh, ReduceKind::kSum, p.contract, block);
  whole.dtype = dtype_name<T>();
  if (use_shared_memory(mesh, whole, false)) return {};  // memory copies: nothing to overlap

  std::vector<int> devices;
  for (const auto& s : a.addressable_shards()) devices.push_back(s.device);
  auto d = std::make_shared<DeferredSum<T>>(natural, c_shape, devices);
  if (t_acc.depth > 0) {
    // Gradient accumulation: this rank's products into the step's sums; one reduction, on the last.
    std::vector<Tensor<T>> partial;
    for (std::size_t i = 0; i < devices.size(); ++i) {
      partial.emplace_back(Shape{block[0], n});
      gemm_rows(a.addressable_shards()[i].data, ta, b.addressable_shards()[i].data, tb, 0, block[0],
                partial[i]);
    }
    auto sums = accumulate<T>(std::move(partial));
    if (!sums) return zeros_for<T>(natural, c_shape);
    d->blocks_ = std::move(*sums);
    sum_in_buckets(*d, mesh, p.contract, block[0], n, gradient_reduction().bfloat16,
                   [](std::int64_t, std::int64_t) {});
    register_in_flight(d);
    return [d] { return d->take(); };
  }
  for (std::size_t i = 0; i < devices.size(); ++i) d->blocks_.emplace_back(block);
  const std::int64_t rows = std::max<std::int64_t>(
      1, gradient_reduction().bucket_bytes / std::max<std::int64_t>(1, n * static_cast<std::int64_t>(sizeof(T))));
  const std::int64_t step = std::max<std::int64_t>(1, rows / 4);  // the gemm's pieces between tests
  sum_in_buckets(*d, mesh, p.contract, block[0], n, gradient_reduction().bfloat16, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t q = r0; q < r1; q += step) {
      for (std::size_t i = 0; i < devices.size(); ++i)
        gemm_rows(a.addressable_shards()[i].data, ta, b.addressable_shards()[i].data, tb, q, std::min(r1, q + step),
                  d->blocks_[i]);
      progress_reductions();
    }
  });
  register_in_flight(d);
  return [d] { return d->take(); };
}

template <Dtype T>
std::function<ShardedArray<T>()> psum_deferred(std::vector<Tensor<T>> blocks, const SpecEntry& axes,
                                               const NamedSharding& sharding, const Shape& shape, bool parameter) {
  if constexpr (std::is_same_v<T, bfloat16>) {
    // bfloat16 cotangents are summed in float32 (the same buckets, behind the backward pass)
    // and each sum rounded once when taken.
    std::vector<Tensor<float>> wide;
    wide.reserve(blocks.size());
    for (const auto& b : blocks) wide.push_back(astype_kernel<float>(b));
    auto take = psum_deferred<float>(std::move(wide), axes, sharding, shape, parameter);
    return [take = std::move(take)] {
      const ShardedArray<float> sum = take();
      std::vector<Shard<bfloat16>> shards;
      for (const auto& s : sum.addressable_shards())
        shards.push_back(Shard<bfloat16>{s.device, s.box, astype_kernel<bfloat16>(s.data)});
      return ShardedArray<bfloat16>(sum.shape(), sum.sharding(), std::move(shards));
    };
  }
  const Mesh& mesh = sharding.mesh();
  const Shape block = sharding.shard_shape(shape);
  const std::int64_t rows = block.empty() ? 1 : block[0];
  std::int64_t n = 1;
  for (std::size_t k = 1; k < block.size(); ++k) n *= block[k];
  auto d = std::make_shared<DeferredSum<T>>(sharding, shape, mesh.local_device_ids());
  if (blocks.size() != d->devices_.size())
    raise<Error>("psum_deferred: ", blocks.size(), " blocks for ", d->devices_.size(), " local devices (internal error)");
  for (auto& b : blocks) {
    if (b.shape() != block)
      raise<Error>("psum_deferred: a block of shape ", to_string(b.shape()), " for blocks of ", to_string(block),
                   " (internal error)");
    if (!b.unique_storage()) b = Tensor<T>(b);  // summed in place: nothing else may see it
    b.set_ad(nullptr);
    d->blocks_.push_back(std::move(b).reshaped(Shape{rows, n}));
  }
  if (parameter && t_acc.depth > 0) {  // gradient accumulation: one reduction, on the last micro-batch
    auto sums = accumulate<T>(std::move(d->blocks_));
    if (!sums) return zeros_for<T>(sharding, shape);
    d->blocks_ = std::move(*sums);
  }
  sum_in_buckets(*d, mesh, axes, rows, n, parameter && gradient_reduction().bfloat16,
                 [](std::int64_t, std::int64_t) {});
  if (t_scope.depth > 0) register_in_flight(d);
  return [d] { return d->take(); };
}

#define SHARD_INSTANTIATE_DEFERRED(T)                             \
  template std::function<ShardedArray<T>()> matmul_t_deferred<T>( \
      const ShardedArray<T>&, bool, const ShardedArray<T>&, bool, const NamedSharding&); \
  template std::function<ShardedArray<T>()> psum_deferred<T>(std::vector<Tensor<T>>, const SpecEntry&, \
                                                             const NamedSharding&, const Shape&, bool);
SHARD_FOR_EACH_FLOAT_DTYPE(SHARD_INSTANTIATE_DEFERRED)
#undef SHARD_INSTANTIATE_DEFERRED

}  // namespace detail
}  // namespace shard
