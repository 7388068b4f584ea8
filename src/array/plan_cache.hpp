#pragma once
// The plan caches behind plan_matmul and plan_reshard (internal; counters in
// shard/array/detail/plan_cache.hpp). A plan is metadata computed from the operands' signatures
// alone (shapes, shardings, element size), the same on every rank, so a cached plan is the
// plan a fresh computation would return: ranks whose caches differ still run the same plan.
//
// Key: every field the plan reads, encoded as 64-bit words (no strings built): each mesh by
// content (shape, axis names, device ids, the topology fields plans read), each spec entry by
// its axis names, shapes, element size. Content rather than identity: a mesh rebuilt after
// the last copy of an equal one died hits the same entries, and the cache holds no Mesh (which
// would keep its communicators alive past the user's last copy).
// Value: shared_ptr<const Plan>, so a hit copies no specs. Bounded LRU (list + hash map),
// one mutex per cache; a miss computes without the lock (two threads missing the same key
// both compute it, the second insert is dropped).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "shard/array/detail/plan_cache.hpp"
#include "shard/sharding/named_sharding.hpp"

namespace shard {
struct MatmulPlan;
struct ReshardPlan;
}  // namespace shard
namespace shard::detail {
struct OpPlan;
}  // namespace shard::detail

namespace shard::detail {

/// The words of a cache key. Each field is written with its length first, so no two
/// different field sequences encode the same words.
class SignatureKey {
 public:
  SignatureKey() { words_.reserve(64); }
  /// Empty again, keeping the storage (callers reuse one thread_local key per cache: no
  /// allocation per lookup).
  void clear() { words_.clear(); }
  void add(std::int64_t w) { words_.push_back(w); }
  void add(const Shape& s) {
    add(static_cast<std::int64_t>(s.size()));
    words_.insert(words_.end(), s.begin(), s.end());
  }
  void add(const std::string& s) {
    add(static_cast<std::int64_t>(s.size()));
    for (std::size_t i = 0; i < s.size(); i += 8) {
      std::uint64_t w = 0;
      std::memcpy(&w, s.data() + i, std::min<std::size_t>(8, s.size() - i));
      add(static_cast<std::int64_t>(w));
    }
  }
  void add(const Mesh& m) {
    add(static_cast<std::int64_t>(m.ndim()));
    for (int i = 0; i < m.ndim(); ++i) {
      add(m.shape()[static_cast<std::size_t>(i)]);
      add(m.axis_names()[static_cast<std::size_t>(i)]);
    }
    add(static_cast<std::int64_t>(m.device_ids().size()));
    for (int d : m.device_ids()) add(d);
    const Topology& t = m.topology();  // what plans read: owner(d) and the rank count
    add(t.process_count);
    add(t.devices_per_rank);
    add(t.process_index);
  }
  void add(const PartitionSpec& p) {  // the written entries (P('a') and P('a', None) differ here)
    add(static_cast<std::int64_t>(p.size()));
    for (const auto& e : p.entries()) {
      add(static_cast<std::int64_t>(e.axes().size()));
      for (const auto& a : e.axes()) add(a);
    }
  }
  void add(const NamedSharding& s) {
    add(s.mesh());
    add(s.spec());
  }

  bool operator==(const SignatureKey& o) const { return words_ == o.words_; }
  std::size_t hash() const {
    std::uint64_t h = words_.size();
    for (std::int64_t w : words_)
      h = ((h << 5 | h >> 59) ^ static_cast<std::uint64_t>(w)) * 0x9E3779B97F4A7C15ull;
    return static_cast<std::size_t>(h ^ h >> 32);  // the equality of the words decides; this only spreads
  }

 private:
  std::vector<std::int64_t> words_;
};

/// A bounded LRU map from SignatureKey to shared_ptr<const Plan>, with hit/miss counters.
template <typename Plan>
class PlanCache {
 public:
  explicit PlanCache(std::size_t capacity) : capacity_(capacity) {}

  /// The cached plan for `key`, or compute() (run without the lock; its exceptions pass
  /// through and nothing is stored) remembered as the most recently used. `key` is copied
  /// before compute() runs (which may reuse the caller's thread_local key for nested plans).
  template <typename Compute>
  std::shared_ptr<const Plan> get(const SignatureKey& key, Compute&& compute) {
    {
      std::lock_guard lock(mutex_);
      if (auto it = index_.find(key); it != index_.end()) {
        ++counters_.hits;
        lru_.splice(lru_.begin(), lru_, it->second);  // most recent first
        return it->second->second;
      }
      ++counters_.misses;
    }
    SignatureKey stored = key;
    auto plan = std::make_shared<const Plan>(compute());
    std::lock_guard lock(mutex_);
    if (capacity_ == 0 || index_.count(stored)) return plan;
    lru_.emplace_front(std::move(stored), plan);
    index_.emplace(lru_.front().first, lru_.begin());
    while (lru_.size() > capacity_) evict_last();
    return plan;
  }

  PlanCacheCounters counters() const {
    std::lock_guard lock(mutex_);
    PlanCacheCounters c = counters_;
    c.size = lru_.size();
    c.capacity = capacity_;
    return c;
  }
  void reset_counters() {
    std::lock_guard lock(mutex_);
    counters_ = PlanCacheCounters{};
  }
  void clear() {
    std::lock_guard lock(mutex_);
    index_.clear();
    lru_.clear();
  }
  void set_capacity(std::size_t capacity) {
    std::lock_guard lock(mutex_);
    capacity_ = capacity;
    while (lru_.size() > capacity_) evict_last();
  }

 private:
  struct Hash {
    std::size_t operator()(const SignatureKey& k) const { return k.hash(); }
  };
  using Entry = std::pair<SignatureKey, std::shared_ptr<const Plan>>;

  void evict_last() {
    index_.erase(lru_.back().first);
    lru_.pop_back();
    ++counters_.evictions;
  }

  mutable std::mutex mutex_;
  std::size_t capacity_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<SignatureKey, typename std::list<Entry>::iterator, Hash> index_;
  PlanCacheCounters counters_;
};

/// The two caches (plan_cache.cpp; never destroyed, so lookups during exit still work).
PlanCache<MatmulPlan>& matmul_plan_cache();
PlanCache<ReshardPlan>& reshard_plan_cache();
/// The driver's op plans (array/driver.hpp; src/array/driver.cpp).
PlanCache<OpPlan>& op_plan_cache();

/// plan_reshard through the cache, without the dtype label (reshard.cpp).
std::shared_ptr<const ReshardPlan> cached_plan_reshard(const Shape& shape, const NamedSharding& from,
                                                       const NamedSharding& to, std::size_t elem_size);
/// plan_matmul through the cache (matmul.cpp).
std::shared_ptr<const MatmulPlan> cached_plan_matmul(const Shape& a_shape, const NamedSharding& a,
                                                     const Shape& b_shape, const NamedSharding& b,
                                                     std::size_t elem_size);

}  // namespace shard::detail
