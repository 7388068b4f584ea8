#pragma once
/// \file The plan caches of matmul and reshard (internals; counters for tests and benchmarks).
///
/// plan_matmul and plan_reshard are metadata only and depend on nothing but the operands'
/// signatures, so each remembers its plans, like PyTorch DTensor's ShardingPropagator caches
/// its propagation keyed by the operands' specs:
///   - the matmul cache: key (A's shape, A's sharding, B's shape, B's sharding, element size),
///     value the MatmulPlan. The shape and device checks and the candidate layouts' reshard
///     plans run on a miss only; a hit returns the remembered plan.
///   - the reshard cache: key (shape, source sharding, target sharding, element size), value
///     the ReshardPlan (its dtype label is filled in per call).
/// A sharding enters a key by its mesh's content (shape, axis names, device ids in order, rank
/// count, devices per rank, this rank's index) and its spec as written. Each cache is a
/// bounded LRU (kDefaultPlanCacheCapacity entries unless set_plan_cache_capacity says
/// otherwise), guarded by a mutex (shard_map bodies on several device threads share it). A
/// repeated shard::matmul with one signature, and the products of its backward pass from the
/// second step on, plan nothing.

#include <cstddef>
#include <cstdint>

namespace shard::detail {

/// The entries each plan cache keeps unless set_plan_cache_capacity changes it.
inline constexpr std::size_t kDefaultPlanCacheCapacity = 512;

/// One cache's counters since the last reset_plan_cache_stats (size and capacity: now).
struct PlanCacheCounters {
  std::int64_t hits = 0;       ///< lookups answered from the cache (no planning)
  std::int64_t misses = 0;     ///< lookups that planned (and checked the operands)
  std::int64_t evictions = 0;  ///< least recently used entries dropped to stay within capacity
  std::size_t size = 0;        ///< entries held
  std::size_t capacity = 0;    ///< the most entries held
};

/// The counters of both caches (this process; every thread's lookups).
struct PlanCacheStats {
  PlanCacheCounters matmul;   ///< plan_matmul (shard::matmul, its VJP's products, grad_reduce)
  PlanCacheCounters reshard;  ///< plan_reshard (reshard, reshard_plan, plan_matmul's misses)
  PlanCacheCounters op;       ///< the driver's plan_op (ops bound through shard::bind)
};

/// The counters now.
PlanCacheStats plan_cache_stats();
/// Zeroes hits, misses and evictions of both caches (the entries stay).
void reset_plan_cache_stats();
/// Drops every entry of both caches (the counters stay): the next lookups miss.
void clear_plan_caches();
/// The most entries each cache holds; 0 turns caching off (every lookup plans). Dropping to a
/// smaller capacity evicts the least recently used entries.
void set_plan_cache_capacity(std::size_t entries);

}  // namespace shard::detail
