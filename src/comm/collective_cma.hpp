#pragma once
// all_to_all between ranks of one node by direct reads of the peers' blocks (comm layer
// internals; collective_cma.cpp).

#include <cstdint>
#include <vector>

#include "shard/core/box.hpp"
#include "shard/comm/detail/collective.hpp"
#include "shard/comm/detail/mesh_comms.hpp"
#include "shard/sharding/mesh.hpp"
#include "shard/core/tensor.hpp"

namespace shard::detail {

/// The Runtime's start-up probe: cma_probe(pid, address) reads the word at `address` (another
/// rank's cma_probe_word()) in process `pid` and checks it; set_cma_allowed(the minimum over
/// the world of those results) enables the route.
const std::uint64_t* cma_probe_word();
bool cma_probe(std::int64_t pid, std::int64_t address);
void set_cma_allowed(bool on);

/// Whether `s` may take the direct-read route: a tiled all_to_all that is not contiguous on
/// both sides (dims 0 and 0), whose groups each share a node, with group-shared transfers
/// allowed (SHARD_SHARED_REDUCE) and no earlier failure. Collective over the mesh's ranks the
/// first time for s.axes (every rank calls it for the same collective).
bool cma_possible(const Mesh& mesh, const CollectiveSpec& s);

/// The all_to_all of one device per rank of `g` (position = communicator rank): out's chunk
/// out_chunks[q] receives chunk in_chunks[me] of rank q's x, read straight from q's memory
/// (process_vm_readv), for every q but this rank (the caller copies its own chunk). Blocking
/// and collective over g; true. A read that fails (after the probe succeeded) raises
/// RuntimeError on every rank of g.
template <typename T>
bool all_to_all_by_cma(const CollectiveSpec& s, const DeviceGroup& g, const Tensor<T>& x, Tensor<T>& out,
                       const std::vector<Box>& in_chunks, const std::vector<Box>& out_chunks);

}  // namespace shard::detail
