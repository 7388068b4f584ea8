// A user program built against an installed Shard (find_package(Shard) or pkg-config shard).
// On a mesh of all devices it draws a random array with shard::random, runs a shard_map body
// that psums each block over mesh axis 'b', and multiplies two random matrices with
// shard::matmul (plus ScaLAPACK's p?gemm when a rank has one device). Every rank checks its
// own shards and the gathered results against serial loops on the host over the same random
// numbers generated in one process; any difference is an error naming the rank, the check and
// the element, and a non-zero exit of the whole job.
//
//   mpiexec -n 2 consumer [--devices-per-rank k] [--corrupt-reference]
//
// --corrupt-reference adds 1 to one element of the psum reference, to show the check fails.

#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>

#include <shard/shard.hpp>

namespace {

using shard::None;
using shard::P;
using shard::Shape;
using shard::Tensor;

/// The value of `ref` at the global multi-index of element `flat` of a block at `offset`.
double at_offset(const Tensor<double>& ref, const shard::Box& box, std::int64_t flat) {
  const std::int64_t cols = box.extent[1];
  const std::int64_t i = box.offset[0] + flat / cols, j = box.offset[1] + flat % cols;
  return ref.flat(i * ref.shape()[1] + j);
}

/// Throws, naming the rank and the first element where `got` (a block at `box`) differs from `ref`.
void expect_near(const Tensor<double>& got, const shard::Box& box, const Tensor<double>& ref,
                 const std::string& what, double tol) {
  for (std::int64_t k = 0; k < got.size(); ++k) {
    const double want = at_offset(ref, box, k);
    if (!(std::abs(got.flat(k) - want) <= tol * (1.0 + std::abs(want)))) {
      std::ostringstream msg;
      msg << "consumer: " << what << " differs from the host reference at element ("
          << box.offset[0] + k / box.extent[1] << ", " << box.offset[1] + k % box.extent[1] << "): got "
          << got.flat(k) << ", want " << want;
      throw std::runtime_error(msg.str());
    }
  }
}

/// Every local shard of `x`, then the whole gathered array, against the host reference.
void check(const shard::ShardedArray<double>& x, const Tensor<double>& ref, const std::string& what,
           double tol) {
  if (x.shape() != ref.shape()) throw std::runtime_error("consumer: " + what + " has the wrong shape");
  for (const auto& s : x.addressable_shards()) expect_near(s.data, s.box, ref, what + " (local shard)", tol);
  expect_near(x.to_host(), shard::full_box(ref.shape()), ref, what + " (gathered)", tol);
}

/// c = a @ b with the textbook triple loop.
Tensor<double> host_matmul(const Tensor<double>& a, const Tensor<double>& b) {
  const std::int64_t m = a.shape()[0], k = a.shape()[1], n = b.shape()[1];
  Tensor<double> c(Shape{m, n}, 0.0);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t q = 0; q < k; ++q)
      for (std::int64_t j = 0; j < n; ++j) c.flat(i * n + j) += a.flat(i * k + q) * b.flat(q * n + j);
  return c;
}

int run(shard::Runtime& rt, bool corrupt_reference) {
  const int n = rt.device_count();
  const int nb = n % 2 == 0 ? 2 : 1;
  const int na = n / nb;
  const shard::Mesh mesh = shard::make_mesh({na, nb}, {"a", "b"});
  const shard::NamedSharding blocks(mesh, P("a", "b"));
  const auto key = shard::random::key(20240611);

  // psum over 'b' inside shard_map: block (i, j) of x summed over j, replicated along 'b'.
  const Shape shape{6 * na, 5 * nb};
  const auto x = shard::random::uniform<double>(key, shape, blocks, -1.0, 1.0);
  const Tensor<double> host_x = shard::random::uniform_box<double>(key, shape, shard::full_box(shape), -1.0, 1.0);
  check(x, host_x, "random::uniform", 0.0);

  const std::int64_t cols = shape[1] / nb;
  Tensor<double> ref_sum(Shape{shape[0], cols}, 0.0);
  for (std::int64_t i = 0; i < shape[0]; ++i)
    for (std::int64_t j = 0; j < shape[1]; ++j) ref_sum.flat(i * cols + j % cols) += host_x.flat(i * shape[1] + j);
  if (corrupt_reference) ref_sum.flat(0) += 1.0;
  const auto summed = shard::shard_map(mesh, P("a", "b"), P("a", None), [](shard::DeviceContext& ctx, const Tensor<double>& block) { return ctx.psum(block, "b"); })(x);
  check(summed, ref_sum, "shard_map psum over 'b'", 1e-14);

  // matmul on the 2-D block layout (Cannon or SUMMA, OpenBLAS locally).
  const auto keys = shard::random::split(key, 2);
  const Shape sa{4 * n, 3 * n}, sb{3 * n, 2 * n};
  const auto a = shard::random::normal<double>(keys[0], sa, blocks);
  const auto b = shard::random::normal<double>(keys[1], sb, blocks);
  const Tensor<double> ref_c = host_matmul(shard::random::normal_box<double>(keys[0], sa, shard::full_box(sa)),
                                           shard::random::normal_box<double>(keys[1], sb, shard::full_box(sb)));
  check(shard::matmul(a, b), ref_c, "matmul", 1e-12);
  if (rt.devices_per_rank() == 1)  // ScaLAPACK runs one process per grid cell
    check(shard::matmul(a, b, shard::Algorithm::kScaLAPACK), ref_c, "matmul with ScaLAPACK", 1e-12);

  if (rt.process_index() == 0)
    std::printf("consumer: psum and matmul on a %dx%d mesh (%d ranks x %d devices) match the host reference%s\n",
                na, nb, rt.process_count(), rt.devices_per_rank(),
                rt.devices_per_rank() == 1 ? " (ScaLAPACK too)" : "");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool corrupt_reference = false;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--corrupt-reference") == 0) corrupt_reference = true;
  return shard::guarded_main(argc, argv, [&](shard::Runtime& rt) { return run(rt, corrupt_reference); });
}
