// gtest main for tests run under mpiexec (see mpi_test.hpp).

#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "shard/error.hpp"

namespace shard::testing {

namespace {

Runtime* g_runtime = nullptr;
std::vector<std::string> g_failures;  // this rank's failures in the current test

/// Records this rank's failures; on rank 0 also forwards every event to gtest's printer,
/// with "[rank 0] " put before rank 0's own failure messages.
class RankListener : public ::testing::EmptyTestEventListener {
 public:
  explicit RankListener(::testing::TestEventListener* printer) : printer_(printer) {}
  ~RankListener() override { delete printer_; }

  void OnTestProgramStart(const ::testing::UnitTest& u) override { if (printer_) printer_->OnTestProgramStart(u); }
  void OnTestIterationStart(const ::testing::UnitTest& u, int i) override {
    if (printer_) printer_->OnTestIterationStart(u, i);
  }
  void OnEnvironmentsSetUpStart(const ::testing::UnitTest& u) override {
    if (printer_) printer_->OnEnvironmentsSetUpStart(u);
  }
  void OnEnvironmentsSetUpEnd(const ::testing::UnitTest& u) override { if (printer_) printer_->OnEnvironmentsSetUpEnd(u); }
  void OnTestSuiteStart(const ::testing::TestSuite& s) override { if (printer_) printer_->OnTestSuiteStart(s); }
  void OnTestStart(const ::testing::TestInfo& t) override {
    g_failures.clear();
    if (printer_) printer_->OnTestStart(t);
  }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    std::string msg = r.message();
    if (r.failed() && msg.rfind("[rank ", 0) != 0) {
      g_failures.push_back(std::string(r.file_name() ? r.file_name() : "?") + ":" + std::to_string(r.line_number()) +
                           ": " + msg);
      msg = "[rank 0] " + msg;
    }
    if (printer_) printer_->OnTestPartResult(::testing::TestPartResult(r.type(), r.file_name(), r.line_number(), msg.c_str()));
  }
  void OnTestEnd(const ::testing::TestInfo& t) override { if (printer_) printer_->OnTestEnd(t); }
  void OnTestSuiteEnd(const ::testing::TestSuite& s) override { if (printer_) printer_->OnTestSuiteEnd(s); }
  void OnEnvironmentsTearDownStart(const ::testing::UnitTest& u) override {
    if (printer_) printer_->OnEnvironmentsTearDownStart(u);
  }
  void OnEnvironmentsTearDownEnd(const ::testing::UnitTest& u) override {
    if (printer_) printer_->OnEnvironmentsTearDownEnd(u);
  }
  void OnTestIterationEnd(const ::testing::UnitTest& u, int i) override { if (printer_) printer_->OnTestIterationEnd(u, i); }
  void OnTestProgramEnd(const ::testing::UnitTest& u) override { if (printer_) printer_->OnTestProgramEnd(u); }

 private:
  ::testing::TestEventListener* printer_;  // owned; null on ranks other than 0
};

}  // namespace

Runtime& runtime() { return *g_runtime; }

void MpiTest::TearDown() {
  // Every rank sends its failure text to every rank.
  std::string mine;
  for (const auto& f : g_failures) mine += f + "\n";
  const MPI_Comm comm = g_runtime->world().get();
  const int n = g_runtime->process_count();
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(n), displs(n);
  MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm);
  int total = 0;
  for (int r = 0; r < n; ++r) {
    displs[r] = total;
    total += lens[r];
  }
  std::string all(static_cast<std::size_t>(total), '\0');
  MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, comm);
  const int me = g_runtime->process_index();
  for (int r = 0; r < n; ++r)
    if (r != me && lens[r] > 0) {
      const std::string text = "[rank " + std::to_string(r) + "] " + all.substr(displs[r], lens[r]);
      GTEST_NONFATAL_FAILURE_(text.c_str());
    }
}

}  // namespace shard::testing

int main(int argc, char** argv) {
  shard::Runtime rt(argc, argv);
  shard::testing::g_runtime = &rt;
  ::testing::InitGoogleTest(&argc, argv);
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  auto* printer = listeners.Release(listeners.default_result_printer());
  const bool root = rt.process_index() == 0;
  if (!root) {
    delete printer;
    printer = nullptr;
    GTEST_FLAG_SET(output, "");  // only rank 0 writes the XML report
  }
  listeners.Append(new shard::testing::RankListener(printer));
  if (root)
    std::printf("[ shard    ] %d ranks x %d devices per rank\n", rt.process_count(), rt.devices_per_rank());
  const int rc = RUN_ALL_TESTS();
  const int any = rt.world().allreduce(rc, MPI_MAX);
  return any;
}
