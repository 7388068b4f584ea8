// fault_injection <mode>: a small program that fails on purpose, for the reliability tests
// (tests/reliability.cmake runs it under mpiexec through expect_failure.sh). Every failure
// mode must end the whole job with a non-zero exit code and "[rank r] error: ..." on stderr,
// never hang. Modes (2 ranks; --devices-per-rank 1 or 2):
//   ok              every collective once inside shard_map, then an array-level psum: exits 0
//   throw_in_psum   rank 1's body throws before the psum the other ranks wait in
//   device_throw    the last device thread of rank 0 throws (run with 2 devices per rank)
//   axes_mismatch   rank 0 calls psum over 'a', rank 1 over 'b' (SHARD_CHECK_COLLECTIVES=1)
//   op_mismatch     rank 0 calls psum, rank 1 pmax over the same axis (SHARD_CHECK_COLLECTIVES=1)
//   sleep           rank 1 sleeps 30 s before the psum (SHARD_COLLECTIVE_TIMEOUT=2)
//   app_throw       rank 1 throws in application code while rank 0 is in an array-level psum
//   throw_int       rank 1 throws 42 (not a std::exception) while rank 0 is in a psum
//   device_put_ndim rank 1 passes a 1-D host array to device_put, rank 0 a 2-D one
//   alloc_fail      rank 1 cannot allocate its block (an AllocationError) while rank 0 goes on to a psum
//   mpi_error       an MPI call fails on rank 1 only (an MpiError) while rank 0 goes on to a psum
// Modes for the default settings (no SHARD_* variable set; tests/reliability.cmake):
//   kind_mismatch   rank 0 calls psum, rank 1 all_gather over the same axis inside shard_map
//   shape_mismatch  rank 0 calls psum of its block, rank 1 of the block's first row
//   skip            rank 0 skips an array-level psum and ends; rank 1 calls it
//   early_return    rank 1's shard_map body returns before the psum rank 0 calls
//   both_throw      rank 1 throws in application code while rank 0's shard_map body throws
//   watch           the watcher thread (limit set to 2 s here): rank 1 computes for 60 s while
//                   rank 0 waits in a psum
// Under SHARD_CHECK_COLLECTIVES=1 (the test suite's setting) every rank prints an error line:
// the failing rank its own, the others "rank 1 failed: ..." (announced to the waiting ranks).

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>

#include "shard/comm/detail/collective_guard.hpp"
#include "shard/shard.hpp"

namespace {

using shard::DeviceContext;
using shard::Tensor;

int run(shard::Runtime& rt, const std::string& mode) {
  const int rank = rt.process_index();
  const int k = rt.devices_per_rank();
  // Rank r holds row r of an (ranks, k) mesh: 'a' crosses ranks, 'b' stays on one.
  const shard::Mesh mesh2 = shard::make_mesh({rt.process_count(), k}, {"a", "b"});
  const shard::Mesh mesh1 = shard::make_mesh({rt.device_count()}, {"a"});
  const auto x = shard::zeros<double>({2 * rt.device_count(), 3}, shard::NamedSharding(mesh1, shard::P("a")));
  const std::function<Tensor<double>(DeviceContext&, const Tensor<double>&)> body =
      [&](DeviceContext& ctx, const Tensor<double>& b) -> Tensor<double> {
    const int local = ctx.device() - rank * k;
    if (mode == "throw_in_psum" && rank == 1 && local == 0)
      throw std::runtime_error("injected failure on rank 1 inside shard_map, before its psum");
    if (mode == "device_throw" && rank == 0 && local == k - 1)
      throw std::runtime_error("injected failure on device " + std::to_string(ctx.device()) + " (rank 0, thread " +
                               std::to_string(local) + ") inside shard_map");
    if (mode == "sleep" && rank == 1) std::this_thread::sleep_for(std::chrono::seconds(30));
    if (mode == "kind_mismatch") {
      if (rank == 0) return ctx.psum(b, "a");
      return ctx.all_gather(b, "a", 0, true);
    }
    if (mode == "shape_mismatch") {
      if (rank == 0) return ctx.psum(b, "a");
      return ctx.psum(b[{shard::Slice(0, 1)}], "a");
    }
    if (mode == "early_return" && rank == 1) return b;
    if (mode == "both_throw") throw std::runtime_error("injected failure in rank 0's shard_map body");
    if (mode == "op_mismatch") {
      if (rank == 0) return ctx.psum(b, "a");  // FAULT-SITE-PSUM
      return ctx.pmax(b, "a");                 // FAULT-SITE-PMAX
    }
    Tensor<double> y = ctx.psum(b, "a");
    if (mode == "ok") {
      y = ctx.pmean(std::move(y), "a");
      const auto g = ctx.all_gather(b, "a", 0, true);
      const auto s = ctx.psum_scatter(g, "a", 0, true);
      const auto t = ctx.all_to_all(g, "a", 0, 0, true);
      const int n = ctx.axis_size("a");
      std::vector<std::pair<int, int>> perm;
      for (int i = 0; i < n; ++i) perm.emplace_back(i, (i + 1) % n);
      const auto p = ctx.ppermute(b, "a", perm);
      if (s.shape() != b.shape() || t.shape() != g.shape() || p.shape() != b.shape())
        throw std::runtime_error("ok: wrong shapes");
    }
    return y;
  };
  if (mode == "axes_mismatch") {
    const auto z = shard::zeros<double>({rt.process_count() * 2, k * 2}, shard::NamedSharding(mesh2, shard::P("a", "b")));
    shard::shard_map(mesh2, shard::P("a", "b"), shard::P("a", "b"), [&](DeviceContext& ctx, const Tensor<double>& b) -> Tensor<double> {
          if (rank == 0) return ctx.psum(b, "a");  // FAULT-SITE-A
          return ctx.psum(b, "b");                 // FAULT-SITE-B
        })(z);
    return 0;
  }
  if (mode == "throw_int") {  // not a std::exception: still "[rank 1] error: ..." and the job ends
    const auto r = shard::zeros<double>({4, 3}, shard::NamedSharding(mesh1, shard::P()));
    if (rank == 1) throw 42;
    (void)shard::psum(r, "a");
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  if (mode == "device_put_ndim") {  // rank 1 passes a 1-D host array, the others 2-D: an error on every rank
    const std::int64_t rows = 2 * rt.device_count();
    const Tensor<double> host(rank == 1 ? shard::Shape{rows * 3} : shard::Shape{rows, 3}, 1.5);
    (void)shard::device_put(host, shard::NamedSharding(mesh1, shard::P("a", shard::None)));
    return 0;
  }
  if (mode == "alloc_fail") {
    // 2^58 float32 elements on rank 1 (2^60 bytes: beyond any x86-64 address space, so the
    // allocation fails even where the kernel overcommits memory), 4 on rank 0.
    const std::int64_t per = rank == 1 ? (std::int64_t{1} << 58) : 4;
    const Tensor<float> block({per});
    (void)block;
    (void)shard::psum(shard::zeros<double>({4, 3}, shard::NamedSharding(mesh1, shard::P())), "a");
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  if (mode == "mpi_error") {
    if (rank == 1) {  // a negative count: MPI_ERR_COUNT, returned (not fatal) on the Runtime's world
      int dummy = 0;
      shard::mpi::check(MPI_Bcast(&dummy, -1, MPI_INT, 0, rt.world().get()), "MPI_Bcast");
    }
    (void)shard::psum(shard::zeros<double>({4, 3}, shard::NamedSharding(mesh1, shard::P())), "a");
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  if (mode == "exit_one") {  // std::exit(0) on rank 1 while rank 0 waits in a psum
    const auto r = shard::zeros<double>({4, 3}, shard::NamedSharding(mesh1, shard::P()));
    if (rank == 1) std::exit(0);
    (void)shard::psum(r, "a");
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  if (mode == "checkpoint_mismatch") {  // rank 1 records one more array than rank 0
    // (the agreement comes before anything is created: the directory stays absent)
    shard::CheckpointWriter w((std::filesystem::temp_directory_path() / "shard_fault_checkpoint_mismatch").string(), 2);
    const auto a = shard::zeros<float>({4, 3}, shard::NamedSharding(mesh1, shard::P()));
    w.add("a", a);
    if (rank == 1) w.add("extra", a);
    (void)w.commit(1);
    return 0;
  }
  if (mode == "skip") {
    const auto r = shard::zeros<double>({4, 3}, shard::NamedSharding(mesh1, shard::P()));
    if (rank == 1) (void)shard::psum(r, "a");
    return 0;
  }
  if (mode == "watch") {
    shard::detail::start_collective_watch(2.0);
    const auto r = shard::zeros<double>({4, 3}, shard::NamedSharding(mesh1, shard::P()));
    if (rank == 1) std::this_thread::sleep_for(std::chrono::seconds(60));
    (void)shard::psum(r, "a");
    return 0;
  }
  if (mode == "both_throw" && rank == 1) throw std::runtime_error("injected failure in application code on rank 1");
  if (mode == "app_throw") {
    const auto r = shard::zeros<double>({4, 3}, shard::NamedSharding(mesh1, shard::P()));
    if (rank == 1) throw std::runtime_error("injected failure in application code on rank 1");
    (void)shard::psum(r, "a");
    std::this_thread::sleep_for(std::chrono::seconds(60));  // never reached in time: the job is aborted
    return 0;
  }
  const auto y = shard::shard_map(mesh1, shard::P("a"), shard::P("a"), body)(x);
  if (mode == "ok") {
    (void)shard::psum(shard::zeros<double>({4, 3}, shard::NamedSharding(mesh1, shard::P())), "a");
    if (rank == 0) std::printf("fault_injection ok: %d ranks x %d devices\n", rt.process_count(), k);
    return 0;
  }
  if (mode == "throw_in_psum" || mode == "device_throw" || mode == "sleep" || mode == "op_mismatch" ||
      mode == "kind_mismatch" || mode == "shape_mismatch" || mode == "early_return" || mode == "both_throw")
    throw std::runtime_error("mode " + mode + ": the failure did not stop the job");
  throw std::runtime_error("unknown mode '" + mode + "'");
}

}  // namespace

int main(int argc, char** argv) {
  return shard::guarded_main(argc, argv, [&](shard::Runtime& rt) {
    std::string mode = "ok";
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--devices-per-rank") ++i;
      else if (a.rfind("--", 0) != 0) mode = a;
    }
    return run(rt, mode);
  });
}
