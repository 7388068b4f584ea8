// Runtime, devices, hosts, make_mesh on the real topology, and the MPI layer.

#include <cstdlib>
#include <set>
#include <string>

#include "mpi_test.hpp"
#include "shard/comm/detail/collective_guard.hpp"
#include "shard/mpi/agree.hpp"
#include "shard/runtime/detail/env.hpp"
#include "shard/runtime/detail/layer_hooks.hpp"
#include "test_util.hpp"

namespace shard::testing {
namespace {

SHARD_MPI_TEST(Runtime, DevicesAndRanks) {
  const Runtime& rt = runtime();
  int size = 0;
  int rank = -1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  EXPECT_EQ(rt.process_count(), size);
  EXPECT_EQ(rt.process_index(), rank);
  const char* env = std::getenv("SHARD_DEVICES_PER_RANK");  // set by the ctest helper
  EXPECT_EQ(rt.devices_per_rank(), env ? std::atoi(env) : 1);
  EXPECT_EQ(rt.device_count(), size * rt.devices_per_rank());
  const auto devices = rt.devices();
  ASSERT_EQ(static_cast<int>(devices.size()), rt.device_count());
  for (int d = 0; d < rt.device_count(); ++d) {
    EXPECT_EQ(devices[d].id, d);
    EXPECT_EQ(devices[d].process_index, d / rt.devices_per_rank());
    EXPECT_EQ(devices[d].local_index, d % rt.devices_per_rank());
    EXPECT_FALSE(devices[d].host.empty());
  }
  const auto local = rt.local_devices();
  ASSERT_EQ(static_cast<int>(local.size()), rt.devices_per_rank());
  for (const auto& d : local) EXPECT_EQ(d.process_index, rank);
  EXPECT_GE(rt.thread_level(), MPI_THREAD_FUNNELED);
}

SHARD_MPI_TEST(Runtime, NodesFromSharedMemory) {
  const Runtime& rt = runtime();
  // Node ids are dense and ranks on one node share the host name.
  std::set<int> nodes(rt.topology().node_of_process.begin(), rt.topology().node_of_process.end());
  EXPECT_EQ(static_cast<int>(nodes.size()), rt.node_count());
  EXPECT_EQ(*nodes.begin(), 0);
  for (int p = 0; p < rt.process_count(); ++p)
    for (int q = 0; q < rt.process_count(); ++q)
      if (rt.topology().node_of_process[p] == rt.topology().node_of_process[q]) {
        EXPECT_EQ(rt.topology().host_of_process[p], rt.topology().host_of_process[q]);
      }
}

SHARD_MPI_TEST(Runtime, OnlyOneAtATime) {
  EXPECT_THROW(Runtime second, RuntimeError);
  EXPECT_EQ(&Runtime::current(), &runtime());
}

// The comm layer takes part in the Runtime's start and end through the hooks it registers
// (shard/runtime/detail/layer_hooks.hpp), once, and its start ran with the agreed settings.
SHARD_MPI_TEST(Runtime, CommRegistersItsHooks) {
  int comm = 0;
  for (const auto& h : detail::runtime_hooks())
    if (std::string(h.layer) == "comm") {
      ++comm;
      EXPECT_TRUE(h.read_settings && h.start && h.agree_at_end && h.stop && h.fail_program);
    }
  EXPECT_EQ(comm, 1);
  EXPECT_EQ(detail::collective_check_on(), detail::env_flag("SHARD_CHECK_COLLECTIVES").value_or(true));
  if (!std::getenv("SHARD_COLLECTIVE_TIMEOUT")) {  // unset: the watcher thread, at its default limit
    EXPECT_EQ(detail::collective_watch_seconds(), detail::kDefaultCollectiveTimeout);
  }
  const auto grace = detail::env_seconds("SHARD_ABORT_GRACE", 1e6);
  EXPECT_NEAR(detail::abort_grace_seconds(), grace.value_or(5.0), 1e-3);  // agreed in milliseconds
}

// The failing ranks' timed barrier (guarded_main, the Runtime's failed start): every rank joins.
SHARD_MPI_TEST(Mpi, BarrierWithin) { EXPECT_TRUE(mpi::barrier_within(runtime().world().get(), 60.0)); }

SHARD_MPI_TEST(Mesh, MakeMeshKeepsRanksOnMinorAxes) {
  const Runtime& rt = runtime();
  const int k = rt.devices_per_rank();
  const Mesh mesh = make_mesh({rt.process_count(), k}, {"rank", "local"});
  // Along the minor axis 'local' all devices belong to one rank.
  for (int p = 0; p < rt.process_count(); ++p)
    for (int j = 0; j < k; ++j) EXPECT_EQ(rt.topology().owner(mesh.device_at({p, j})), p);
  EXPECT_EQ(static_cast<int>(mesh.local_device_ids().size()), k);
  EXPECT_THROW(make_mesh({rt.device_count() + 1}, {"x"}), ShardingError);
}

SHARD_MPI_TEST(Mpi, CommunicatorSplitAndDup) {
  const auto& world = runtime().world();
  const auto dup = world.dup();
  EXPECT_EQ(dup.size(), world.size());
  EXPECT_EQ(dup.rank(), world.rank());
  const auto odd = world.split(world.rank() % 2, world.rank());
  EXPECT_EQ(odd.size(), (world.size() + 1 - world.rank() % 2) / 2);
  const auto none = world.split(-1, 0);
  EXPECT_TRUE(none.is_null());
  mpi::Communicator moved = world.dup();
  mpi::Communicator target = std::move(moved);
  EXPECT_TRUE(moved.is_null());  // NOLINT(bugprone-use-after-move): moved-from is null by contract
  EXPECT_EQ(target.size(), world.size());
  EXPECT_EQ(world.allreduce(1, MPI_SUM), world.size());
  EXPECT_TRUE(world.any(world.rank() == world.size() - 1));
  EXPECT_FALSE(world.any(false));
}

SHARD_MPI_TEST(Mpi, ErrorsAreAgreedOnEveryRank) {
  const auto& world = runtime().world();
  const int culprit = world.size() - 1;
  try {
    mpi::agreed(world, [&] {
      if (world.rank() == culprit) raise<IoError>("disk full while writing x.npy");
    });
    ADD_FAILURE() << "expected an IoError on every rank";
  } catch (const IoError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("disk full"), std::string::npos) << what;
    EXPECT_NE(what.find("[rank " + std::to_string(world.rank()) + "]"), std::string::npos) << what;
    if (world.rank() != culprit) {
      EXPECT_NE(what.find("rank " + std::to_string(culprit) + " failed"), std::string::npos) << what;
    }
  }
  EXPECT_NO_THROW(mpi::agreed(world, [] {}));
}

SHARD_MPI_TEST(Mpi, CheckNamesRoutineAndRank) {
  try {
    mpi::check(MPI_ERR_COMM, "MPI_Fake_routine");
    ADD_FAILURE() << "expected MpiError";
  } catch (const MpiError& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.routine(), "MPI_Fake_routine");
    EXPECT_NE(what.find("MPI_Fake_routine"), std::string::npos);
    EXPECT_NE(what.find("[rank " + std::to_string(runtime().process_index()) + "]"), std::string::npos);
  }
}

}  // namespace
}  // namespace shard::testing

namespace shard::testing {
namespace {

// axis_communicator: Shard's own communicator of this rank's group, usable for raw MPI calls.
SHARD_MPI_TEST(Interop, AxisCommunicatorIsTheGroupsCommunicator) {
  const int ranks = runtime().process_count(), k = runtime().devices_per_rank();
  // Rank r holds row r of a (ranks, k) mesh: 'a' crosses ranks, 'b' stays on this rank.
  const Mesh mesh = make_mesh({ranks, k}, {"a", "b"});
  if (k == 1) {
    const MPI_Comm c = axis_communicator(mesh, "a");
    if (ranks == 1) {
      EXPECT_EQ(c, MPI_COMM_NULL);
    } else {
      int size = 0, rank = -1;
      MPI_Comm_size(c, &size);
      MPI_Comm_rank(c, &rank);
      EXPECT_EQ(size, ranks);
      EXPECT_EQ(rank, mesh.coords(mesh.local_device_ids()[0])[0]);  // communicator rank = axis index
      // A raw call on it sums over the axis like psum.
      double v = runtime().process_index() + 0.25, sum = 0;
      MPI_Allreduce(&v, &sum, 1, MPI_DOUBLE, MPI_SUM, c);
      EXPECT_DOUBLE_EQ(sum, ranks * (ranks - 1) / 2.0 + 0.25 * ranks);
    }
  } else {
    // Several groups along 'a' hold devices of this rank (one per 'b' index): refused.
    expect_error<ValueError>([&] { (void)axis_communicator(mesh, "a"); }, {"groups along those axes"});
  }
  // 'b' stays on this rank: one group, living here alone: no communicator.
  EXPECT_EQ(axis_communicator(mesh, "b"), MPI_COMM_NULL);
  // All devices on one axis, 2 per rank: one group whose devices share ranks.
  if (k > 1 && ranks > 1) {
    const Mesh flat = make_mesh({ranks * k}, {"x"});
    expect_error<ValueError>([&] { (void)axis_communicator(flat, "x"); }, {"one device per rank"});
  }
}

}  // namespace
}  // namespace shard::testing
