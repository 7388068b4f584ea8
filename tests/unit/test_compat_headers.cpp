// The headers of the flat layout before the layer folders still compile (each forwards to
// its layer's folder), so user code that includes them keeps building.

#include <gtest/gtest.h>

#include "shard/array_ops.hpp"
#include "shard/autodiff.hpp"
#include "shard/blas.hpp"
#include "shard/box.hpp"
#include "shard/checkpoint.hpp"
#include "shard/comm_stats.hpp"
#include "shard/data.hpp"
#include "shard/device.hpp"
#include "shard/dtype.hpp"
#include "shard/group_shared.hpp"
#include "shard/index.hpp"
#include "shard/interop.hpp"
#include "shard/io.hpp"
#include "shard/linalg.hpp"
#include "shard/matmul.hpp"
#include "shard/mesh.hpp"
#include "shard/named_sharding.hpp"
#include "shard/ops.hpp"
#include "shard/optim.hpp"
#include "shard/partition_spec.hpp"
#include "shard/positional_sharding.hpp"
#include "shard/print.hpp"
#include "shard/progress.hpp"
#include "shard/random.hpp"
#include "shard/reshard.hpp"
#include "shard/runtime.hpp"
#include "shard/scalapack.hpp"
#include "shard/shard_map.hpp"
#include "shard/sharded_array.hpp"
#include "shard/tensor.hpp"
#include "shard/tensor_ops.hpp"
#include "shard/visualize.hpp"

// No BLAS header reaches a user's program through Shard's (OpenBLAS's openblas_config.h declares
// a global `typedef uint16_t bfloat16`, which would clash with Shard's under `using namespace
// shard;`).
#if defined(CBLAS_H) || defined(OPENBLAS_CONFIG_H)
#error "a Shard header includes <cblas.h>"
#endif

TEST(CompatHeaders, ForwardToTheLayerFolders) {
  const shard::PartitionSpec spec("a", shard::None);
  EXPECT_EQ(spec.to_string(), "P('a', None)");
}

// A consumer's file: `using namespace shard;` and an unqualified bfloat16, as a scalar and as
// an element type (no global bfloat16 from a BLAS header competes with Shard's).
using namespace shard;

TEST(CompatHeaders, UnqualifiedBfloat16UnderUsingNamespaceShard) {
  bfloat16 x = 3.14159f;
  EXPECT_EQ(float(x), 3.140625f);
  Tensor<bfloat16> t({3}, std::vector<bfloat16>{bfloat16(1.5f), bfloat16(-2.0f), x});
  const Tensor<float> wide = astype<float>(t * 2);
  EXPECT_EQ(wide.flat(0), 3.0f);
  EXPECT_EQ(wide.flat(2), 6.28125f);
  static_assert(std::is_same_v<decltype(t + Tensor<float>({3}, 1.0f)), Tensor<float>>);
  EXPECT_STREQ(dtype_name<bfloat16>(), "bfloat16");
}
