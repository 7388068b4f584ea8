// The fault hook (SHARD_FAULT_COLLECTIVE): one rank diverges at its k-th checked collective, as a
// bug in its code would, so that a sweep over every k (tests/adversarial/fault_sweep.sh) shows
// each position of a program ending in an error on every rank.
//   count          every rank prints how many collectives it checked, at the program's end
//   extra:K[:R]    rank R (default 1) issues one collective more just before its K-th: a
//                  different count
//   rename:K[:R]   rank R's K-th collective is another one (a psum becomes a pmax, anything else
//                  a psum): a different name, or order (the check sees some other collective at
//                  that position either way)
// The hook acts where the collective check compares the ranks' collectives
// (collective_guard.cpp), so it needs the check on (the default); every rank must be given the
// same setting (agreed at start-up); a RANK outside the job is refused, and a fault that never
// fired (K past the run's collectives) ends the job with an error at the program's end.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "comm/collective_guard_internal.hpp"
#include "shard/error.hpp"
#include "shard/mpi/communicator.hpp"

namespace shard::detail {

namespace {

struct FaultHook {
  enum Mode { kOff, kCount, kExtra, kRename } mode = kOff;
  long at = 0;   // the K-th checked collective (from 1)
  int rank = 1;  // the rank that diverges
  long seen = 0;
  bool fired = false;
  std::string text;  // the setting, for messages
};
FaultHook g_fault;

}  // namespace

void configure_fault_hook(bool check) {
  g_fault = FaultHook{};
  const char* v = std::getenv("SHARD_FAULT_COLLECTIVE");
  if (!v || !*v) return;
  const std::string t = v;
  auto bad = [&] {
    raise<ValueError>("SHARD_FAULT_COLLECTIVE='", t,
                      "': expected count, extra:K[:RANK] or rename:K[:RANK] (K >= 1)");
  };
  auto number = [&](const std::string& n) {
    if (n.empty() || n.size() > 12 || n.find_first_not_of("0123456789") != std::string::npos) bad();
    return std::stol(n);
  };
  FaultHook f;
  f.text = t;
  if (t == "count") {
    f.mode = FaultHook::kCount;
  } else {
    const std::size_t c1 = t.find(':');
    const std::string mode = t.substr(0, c1);
    if (c1 == std::string::npos || (mode != "extra" && mode != "rename")) bad();
    f.mode = mode == "extra" ? FaultHook::kExtra : FaultHook::kRename;
    const std::size_t c2 = t.find(':', c1 + 1);
    f.at = number(t.substr(c1 + 1, c2 == std::string::npos ? std::string::npos : c2 - c1 - 1));
    if (f.at < 1) bad();
    long rank = f.rank;
    if (c2 != std::string::npos) rank = number(t.substr(c2 + 1));
    int size = 1;
    if (mpi::is_active()) MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank >= size)
      raise<ValueError>("SHARD_FAULT_COLLECTIVE='", t, "': rank ", rank, " is not in this job of ", size,
                        " ranks: the fault would never fire");
    f.rank = static_cast<int>(rank);
    if (!check)
      raise<ValueError>("SHARD_FAULT_COLLECTIVE='", t,
                        "' acts where the collective check compares the ranks' collectives: it needs "
                        "SHARD_CHECK_COLLECTIVES=1 (the default), not 0");
  }
  g_fault = f;
}

std::int64_t fault_setting_hash() {
  if (g_fault.text.empty()) return 0;
  std::uint64_t h = 1469598103934665603ULL;
  for (const unsigned char c : g_fault.text) h = (h ^ c) * 1099511628211ULL;
  return static_cast<std::int64_t>(h >> 2) | 1;  // > 0, so that ~h < 0 tells it apart
}

FaultAction fault_at_checked_collective(int world_rank) {
  if (g_fault.mode == FaultHook::kOff) return FaultAction::kNone;
  ++g_fault.seen;
  if (g_fault.seen != g_fault.at || world_rank != g_fault.rank) return FaultAction::kNone;
  g_fault.fired = true;
  if (g_fault.mode == FaultHook::kExtra) return FaultAction::kExtra;
  if (g_fault.mode == FaultHook::kRename) return FaultAction::kRename;
  return FaultAction::kNone;
}

CollectiveSpec renamed_by_fault(const CollectiveSpec& s) {
  CollectiveSpec r = s;
  const bool sum = s.kind == CollectiveKind::kReduce && s.op == ReduceKind::kSum;
  r.kind = CollectiveKind::kReduce;
  r.op = sum ? ReduceKind::kMax : ReduceKind::kSum;
  r.name =
      cat(sum ? "pmax" : "psum", " (renamed from ", s.name, " by SHARD_FAULT_COLLECTIVE=", g_fault.text, ")");
  return r;
}

std::string extra_collective_text(const CollectiveSpec& s) {
  return cat("an extra collective injected by SHARD_FAULT_COLLECTIVE=", g_fault.text, " before collective #",
             g_fault.seen, " (", collective_text(s), ")");
}

bool report_fault_outcome(int world_rank) {
  if (g_fault.mode == FaultHook::kCount) {
    std::fprintf(stderr, "%sSHARD_FAULT_COLLECTIVE=count: %ld checked collectives\n", rank_prefix().c_str(),
                 g_fault.seen);
    std::fflush(stderr);
    return true;
  }
  if (g_fault.mode == FaultHook::kOff || g_fault.fired || world_rank != g_fault.rank) return true;
  std::fprintf(stderr, "%serror: SHARD_FAULT_COLLECTIVE=%s never fired: this rank checked %ld collectives\n",
               rank_prefix().c_str(), g_fault.text.c_str(), g_fault.seen);
  std::fflush(stderr);
  return false;
}

}  // namespace shard::detail
