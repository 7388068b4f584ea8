// The driver's planning step (array/driver.hpp): a factor rule applied to the operands'
// shardings, cached by their signatures; and the closing collective a plan names.

#include "shard/array/driver.hpp"

#include <cstdio>
#include <mutex>
#include <set>
#include <string>

#include "array/plan_cache.hpp"
#include "shard/error.hpp"

namespace shard::detail {

PlanCache<OpPlan>& op_plan_cache() {
  static auto* cache = new PlanCache<OpPlan>(kDefaultPlanCacheCapacity);
  return *cache;
}

namespace {

/// The operand the result follows (plan_op's doc).
std::size_t base_operand(const std::vector<OperandLayout>& operands, const Shape& out_shape) {
  for (bool committed_only : {true, false})
    for (std::size_t k = 0; k < operands.size(); ++k)
      if (*operands[k].shape == out_shape && (operands[k].committed || !committed_only)) return k;
  for (std::size_t k = 0; k < operands.size(); ++k)
    if (operands[k].committed) return k;
  return 0;
}

OpPlan compute_plan(const FactorRule::Factors& f, const std::vector<OperandLayout>& operands) {
  const std::size_t base = base_operand(operands, f.result_shape);
  const NamedSharding& bs = *operands[base].sharding;
  // Each factor is split as the base splits it.
  std::vector<SpecEntry> axes(f.sizes.size());
  const std::vector<int>& bf = f.operands[base];
  for (std::size_t d = 0; d < bf.size(); ++d)
    if (bf[d] >= 0) axes[static_cast<std::size_t>(bf[d])] = bs.spec()[static_cast<int>(d)];
  OpPlan plan = plan_with_axes(f, operands, bs.mesh(), axes, base);
  // The result keeps the base's spec as written when it is the base's own layout.
  if (bf == f.result && *operands[base].shape == f.result_shape) plan.out = bs.spec();
  return plan;
}

}  // namespace

OpPlan plan_with_axes(const FactorRule::Factors& f, const std::vector<OperandLayout>& operands,
                      const Mesh& mesh, const std::vector<SpecEntry>& axes, std::size_t base) {
  auto spec_of = [&](const std::vector<int>& ids) {
    std::vector<SpecEntry> entries;
    entries.reserve(ids.size());
    for (int id : ids) entries.push_back(id >= 0 ? axes[static_cast<std::size_t>(id)] : SpecEntry());
    return PartitionSpec(std::move(entries));
  };
  OpPlan plan{base, spec_of(f.result), {}, SpecEntry()};
  for (std::size_t k = 0; k < operands.size(); ++k) {
    PartitionSpec want = spec_of(f.operands[k]);
    if (*operands[k].sharding == NamedSharding(mesh, want))
      plan.want.emplace_back();
    else
      plan.want.emplace_back(std::move(want));
  }
  std::vector<std::string> closing;
  for (const auto& name : mesh.axis_names())
    for (std::size_t id = 0; id < axes.size(); ++id)
      if (f.reduced[id])
        for (const auto& a : axes[id].axes())
          if (a == name) closing.push_back(name);
  plan.closing = SpecEntry(closing);
  return plan;
}

std::shared_ptr<const OpPlan> plan_op(const FactorRule& rule, const FactorRule::Factors& factors,
                                      const std::vector<OperandLayout>& operands) {
  thread_local SignatureKey key;
  key.clear();
  key.add(rule.text());
  for (const auto& o : operands) {
    key.add(*o.shape);
    key.add(*o.sharding);
    key.add(o.committed ? 1 : 0);
  }
  return op_plan_cache().get(key, [&] { return compute_plan(factors, operands); });
}

CollectiveSpec closing_spec(const SpecEntry& axes, ReduceKind op, const NamedSharding& out,
                            const Shape& out_shape, int scatter_dim) {
  if (scatter_dim < 0) return reduce_spec(out.mesh(), op, axes, out.shard_shape(out_shape));
  if (op != ReduceKind::kSum) raise<Error>("a psum_scatter closes only a sum (internal error)");
  // The partial blocks are out's blocks before the scatter: dim scatter_dim not yet split over `axes`.
  Shape block = out.shard_shape(out_shape);
  for (const auto& a : axes.axes()) block[scatter_dim] *= out.mesh().axis_size(a);
  return psum_scatter_spec(out.mesh(), axes, block, scatter_dim, true);
}

void raise_escaped_batch(const char* op) {
  raise<ValueError>("vmap: ", op,
                    ": an operand is a batched value of a vmap that has returned (it escaped the vmapped "
                    "function: stored in a variable outside it, or captured by a lambda that outlives it); "
                    "return it from the function instead, and vmap gives it back with its batch dim");
}

void raise_no_batch_rule(const char* op) {
  raise<ValueError>("vmap: the primitive '", op,
                    "' has no batching rule; give it a batch() member (ops/batching.hpp), or pass "
                    "VmapOptions{.loop_fallback = true} to run it as a loop over the examples");
}

void note_loop_fallback(const char* op, std::int64_t size) {
  static std::mutex mutex;
  static std::set<std::string> told;
  const std::lock_guard<std::mutex> lock(mutex);
  if (!told.insert(op).second) return;
  std::fprintf(
      stderr,
      "vmap: '%s' has no batching rule: running it as a loop over the %lld examples (loop_fallback)\n", op,
      static_cast<long long>(size));
}

}  // namespace shard::detail
