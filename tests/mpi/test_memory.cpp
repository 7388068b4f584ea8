// from_callback never materialises the global array: peak memory on every rank stays near
// its own shards. At 16 ranks the array is 16 times one rank's shards.

#include <sys/resource.h>

#include "mpi_test.hpp"
#include "test_util.hpp"

namespace shard::testing {
namespace {

std::int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<std::int64_t>(u.ru_maxrss) * 1024;  // Linux reports KiB
}

SHARD_MPI_TEST(Memory, FromCallbackAllocatesOnlyLocalShards) {
  const Runtime& rt = runtime();
  const int n = rt.device_count();
  // 64 MiB of doubles per rank, the global array is n / k times that.
  const std::int64_t cols = 1024;
  const std::int64_t rows_per_device = 8 * 1024 / rt.devices_per_rank();
  const Shape shape{rows_per_device * n, cols};
  const std::int64_t local_bytes = rows_per_device * rt.devices_per_rank() * cols * 8;
  const std::int64_t global_bytes = num_elements(shape) * 8;
  const NamedSharding s(make_mesh({n}, {"x"}), P("x"));

  reset_tensor_memory_peak();
  const std::int64_t live_before = tensor_memory_stats().live_bytes;
  const std::int64_t rss_before = peak_rss_bytes();
  const auto a = from_callback<double>(shape, s, [](const Box& b) {
    Tensor<double> t(b.extent);
    for (std::int64_t i = 0; i < t.size(); ++i) t.flat(i) = static_cast<double>(b.offset[0] * 3 + i % 977) * 0.5;
    return t;
  });
  const std::int64_t tensor_peak = tensor_memory_stats().peak_bytes - live_before;
  const std::int64_t rss_growth = peak_rss_bytes() - rss_before;

  EXPECT_EQ(tensor_peak, local_bytes) << "tensor bytes allocated beyond this rank's shards";
  EXPECT_LT(rss_growth, local_bytes + 16 * 1024 * 1024)
      << "peak RSS grew by " << rss_growth << " bytes for " << local_bytes << " bytes of shards (global array "
      << global_bytes << " bytes)";
  // The data is right: spot-check the first element of every local shard.
  for (const auto& sh : a.addressable_shards()) EXPECT_EQ(sh.data.flat(0), static_cast<double>(sh.box.offset[0] * 3) * 0.5);
  if (rt.process_index() == 0)
    std::printf("[ shard    ] global %.0f MiB, per rank %.0f MiB (1/%d), peak RSS growth %.1f MiB\n",
                static_cast<double>(global_bytes) / (1 << 20), static_cast<double>(local_bytes) / (1 << 20),
                rt.process_count(), static_cast<double>(rss_growth) / (1 << 20));
}

}  // namespace
}  // namespace shard::testing
