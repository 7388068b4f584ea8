// The plan caches' instances and their counters (plan_cache.hpp, detail/plan_cache.hpp).

#include "array/plan_cache.hpp"

#include "shard/array/driver.hpp"
#include "shard/array/reshard.hpp"
#include "shard/ops/matmul.hpp"

namespace shard::detail {

PlanCache<MatmulPlan>& matmul_plan_cache() {
  static auto* cache = new PlanCache<MatmulPlan>(kDefaultPlanCacheCapacity);
  return *cache;
}

PlanCache<ReshardPlan>& reshard_plan_cache() {
  static auto* cache = new PlanCache<ReshardPlan>(kDefaultPlanCacheCapacity);
  return *cache;
}

PlanCacheStats plan_cache_stats() {
  return PlanCacheStats{matmul_plan_cache().counters(), reshard_plan_cache().counters(),
                        op_plan_cache().counters()};
}

void reset_plan_cache_stats() {
  matmul_plan_cache().reset_counters();
  reshard_plan_cache().reset_counters();
  op_plan_cache().reset_counters();
}

void clear_plan_caches() {
  matmul_plan_cache().clear();
  reshard_plan_cache().clear();
  op_plan_cache().clear();
}

void set_plan_cache_capacity(std::size_t entries) {
  matmul_plan_cache().set_capacity(entries);
  reshard_plan_cache().set_capacity(entries);
  op_plan_cache().set_capacity(entries);
}

}  // namespace shard::detail
