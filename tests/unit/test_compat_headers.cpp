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
