// Seed 004, "JAX Parallelization: Sharded Matrices and Collective Operations": the cells that
// need no grad, op for op, on 8 devices (e.g. mpirun -n 2 seed_004_sharded_matrices
// --devices-per-rank 4). The seed's jax.jit functions that call lax collectives on named axes
// run inside shard_map here (JAX itself needs shard_map to bind the axis name); its 8000 x 8000
// and 4000 x 4000 matrices are --size S (800 by default) and S / 2.

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "shard/shard.hpp"

using namespace shard;

namespace {
double seconds_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int main(int argc, char** argv) {
  std::int64_t size = 800;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--size") == 0) size = std::atoll(argv[i + 1]);
  return guarded_main(argc, argv, [&](Runtime& rt) {
    auto say = [&](const std::string& s) {
      if (rt.process_index() == 0) std::printf("%s\n", s.c_str());
    };
    const int n_devices = rt.device_count();
    if (n_devices != 8)
      raise<ValueError>("seed 004 needs the tutorial's 8 devices; run e.g. mpirun -n 2 ", argv[0],
                        " --devices-per-rank 4");

    say("## 2. Setting Up for Multi-Device Computation");
    std::string devs = "Available devices: [";
    for (const auto& d : rt.devices()) devs += (d.id ? ", " : "") + device_label(d.id);
    say(devs + "]");
    say("Device count: " + std::to_string(n_devices));
    const std::vector<int> devices = make_mesh({n_devices}, {"devices"}).device_ids();
    const Mesh mesh_1d({n_devices}, {"devices"}, devices);  // Mesh(devices, axis_names=('devices',))
    say("1D Mesh: " + mesh_1d.to_string());
    const Mesh mesh_2d({2, 2}, {"rows", "cols"}, std::vector<int>(devices.begin(), devices.begin() + 4));
    say("2D Mesh: " + mesh_2d.to_string());

    say("## 3. Sharded Matrices in JAX");
    const Tensor<float> large_matrix = ones<float>({size, size});
    char mb[64];
    std::snprintf(mb, sizeof mb, "%.2f", static_cast<double>(large_matrix.size()) * 4 / (1024.0 * 1024.0));
    say("Matrix shape: " + to_string(large_matrix.shape()) + ", Size in memory: " + mb + " MB");
    const NamedSharding shardings(mesh_1d, P("devices", None));
    const auto sharded_matrix = device_put(large_matrix, shardings);
    say(std::string("Sharded matrix type: ShardedArray<") + sharded_matrix.dtype() + ">");
    say("Sharding spec: " + shardings.to_string());
    say("Global shape: " + to_string(sharded_matrix.shape()));
    say("Sharding: " + sharded_matrix.sharding().to_string());
    const Tensor<float> local_chunks = sharded_matrix.to_host();  // multihost_utils.process_allgather
    say("First chunk shape: " + to_string(local_chunks.shape()));

    // Performance: jnp.matmul(x, x) on one device against the same on a row-sharded matrix.
    const std::int64_t benchmark_size = size / 2;
    const Tensor<float> matrix = ones<float>({benchmark_size, benchmark_size});
    (void)matmul(matrix, matrix);
    const double time_single = seconds_of([&] { (void)matmul(matrix, matrix); });
    const auto sharded = device_put(matrix, NamedSharding(mesh_1d, P("devices", None)));
    (void)matmul(sharded, sharded);
    const double time_sharded = seconds_of([&] { (void)matmul(sharded, sharded); });
    say("Single device time: " + std::to_string(time_single) + " seconds");
    say("Sharded time: " + std::to_string(time_sharded) + " seconds");
    say("Speedup: " + std::to_string(time_single / time_sharded) + "x");

    // Row, column and 2-D block sharding of a 1024 x 1024 matrix.
    const Tensor<float> demo_matrix = ones<float>({1024, 1024});
    const NamedSharding row_shardings(mesh_1d, P("devices", None)), col_shardings(mesh_1d, P(None, "devices"));
    const auto row_sharded = device_put(demo_matrix, row_shardings);
    const auto col_sharded = device_put(demo_matrix, col_shardings);
    say("Row sharding: " + row_shardings.to_string());
    say("Column sharding: " + col_shardings.to_string());
    const NamedSharding block_shardings(mesh_2d, P("rows", "cols"));
    const auto block_sharded = device_put(demo_matrix, block_shardings);
    say("Block sharding: " + block_shardings.to_string());
    visualize(row_sharded);
    visualize(col_sharded);
    visualize(block_sharded);

    say("## 4. Collective Operations in JAX");
    // All-reduce: psum over 'devices' of arange(1, n + 1).reshape((n, 1)) sharded by rows.
    const Tensor<std::int32_t> sharded_values = arange<std::int32_t>(1, n_devices + 1).reshape({n_devices, 1});
    const auto sharded_array = device_put(sharded_values, NamedSharding(mesh_1d, P("devices", None)));
    auto all_reduce_sum = shard_map(mesh_1d, P("devices", None), P("devices", None),
                                    [](const Tensor<std::int32_t>& x) { return psum(x, "devices"); });
    say("Original values:");
    print(sharded_values);
    say("After all-reduce sum:");
    print(all_reduce_sum(sharded_array));
    say("Expected sum: " + to_string(sum(arange<std::int32_t>(1, n_devices + 1))));
    // All-gather along axis 0, returned replicated (out_spec P()): all_gather_invariant, whose
    // result is the same on every device (JAX's check_vma rejects a plain all_gather there: its
    // result is typed as varying over 'devices').
    auto all_gather_fn = shard_map(mesh_1d, P("devices", None), P(), [](const Tensor<std::int32_t>& x) {
      return all_gather_invariant(x, "devices", 0);
    });
    say("After all-gather:");
    print(all_gather_fn(sharded_array));
    // All-to-all as written splits the size-1 axis 0 of each (1, n) block: an error.
    const Tensor<std::int32_t> data = arange<std::int32_t>(n_devices * n_devices).reshape({n_devices, n_devices});
    const auto sharded_data = device_put(data, NamedSharding(mesh_1d, P("devices", None)));
    try {
      (void)shard_map(mesh_1d, P("devices", None), P("devices", None), [](const Tensor<std::int32_t>& x) {
        return all_to_all(x, "devices", 0, 1);
      })(sharded_data);
    } catch (const ShapeError& e) {
      say(std::string("all_to_all(split_axis=0, concat_axis=1) of (1, 8) blocks: ") + e.message());
    }
    // Its intent, the rows -> columns transpose of the sharding: split the columns, stack the rows.
    auto all_to_all_fn = shard_map(mesh_1d, P("devices", None), P(None, "devices"), [](const Tensor<std::int32_t>& x) {
      return all_to_all(x, "devices", 1, 0, true);
    });
    say("Original data:");
    print(data);
    const auto result = all_to_all_fn(sharded_data);
    say("After all-to-all:");
    print(result);
    say("Original sharding: " + sharded_data.sharding().to_string());
    say("Result sharding: " + result.sharding().to_string());

    // All-reduce timing by size (rows divisible by the 8 devices).
    for (const std::int64_t s : {16, 128, 1024}) {
      const auto d = device_put(ones<float>({s, s}), NamedSharding(mesh_1d, P("devices", None)));
      auto all_reduce = shard_map(mesh_1d, P("devices", None), P("devices", None),
                                  [](const Tensor<float>& x) { return psum(x, "devices"); });
      (void)all_reduce(d);
      const double t = seconds_of([&] { (void)all_reduce(d); });
      say("Size " + std::to_string(s) + "x" + std::to_string(s) + ", Time: " + std::to_string(t) + " seconds");
    }

    say("## 5. Practical Example: Distributed Matrix Multiplication");
    const std::int64_t m = size / 4;
    const Tensor<float> a = ones<float>({m, m}), b = ones<float>({m, m});
    const Tensor<float> c_baseline = matmul(a, b);
    const auto a_sharded = device_put(a, NamedSharding(mesh_1d, P("devices", None)));
    const auto b_sharded = device_put(b, NamedSharding(mesh_1d, P(None, "devices")));
    const auto c_distributed = matmul(a_sharded, b_sharded);  // computation follows the shardings
    say("Distributed result sharding: " + c_distributed.sharding().to_string());
    say("Maximum difference: " + to_string(max(abs(c_baseline - c_distributed.to_host()))));

    say("## 6. Advanced Topics: automatic sharding");
    // pjit_matmul = pjit.pjit(lambda x, y: jnp.matmul(x, y), in_shardings=(rows, columns), out_shardings=P(None, None))
    const auto pjit_matmul = jit([](const ShardedArray<float>& x, const ShardedArray<float>& y) { return matmul(x, y); },
                                 JitOptions{.in_shardings = {NamedSharding(mesh_1d, P("devices", None)),
                                                             NamedSharding(mesh_1d, P(None, "devices"))},
                                            .out_shardings = {NamedSharding(mesh_1d, P(None, None))}});
    const auto c_auto = pjit_matmul(device_put(a, NamedSharding(mesh_1d, P())), device_put(b, NamedSharding(mesh_1d, P())));
    say(make_jaxpr(pjit_matmul)(a_sharded, b_sharded).to_string());
    say("Auto-sharded result sharding: " + c_auto.sharding().to_string());
    say("Maximum difference: " + to_string(max(abs(c_baseline - c_auto.to_host()))));
    return 0;
  });
}
