#pragma once
/// \file The device tapes of a shard_map body (internals of shard_map.hpp): the vma its values
/// carry (JAX's check_vma) and, while autodiff records, the links to the outer tape.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <source_location>
#include <vector>

#include "shard/array/sharded_array.hpp"
#include "shard/core/detail/tape.hpp"
#include "shard/error.hpp"  // shard::source_location
#include "shard/sharding/partition_spec.hpp"

namespace shard::detail {

/// The mesh axes (bit k: mesh axis k) a spec names.
std::uint32_t spec_axes_mask(const Mesh& mesh, const PartitionSpec& spec);
/// ValueError: a body's output varies over an axis its out_spec omits (JAX's check_vma),
/// naming the shard_map's call site.
[[noreturn]] void raise_output_varies(std::size_t j, const PartitionSpec& spec, std::uint32_t extra,
                                      const Mesh& mesh, bool differentiated,
                                      const shard::source_location& where);

/// The device tapes of a shard_map body (one per local device): each value there carries the
/// mesh axes it varies over (JAX's vma), so an output whose out_spec omits an axis it varies
/// over is caught (JAX's check_vma), whether or not anything is differentiated.
/// Called while autodiff records (autodiff.hpp), it also links the body to the outer tape:
/// as a node of the outer tape it runs after the outputs' nodes have seeded the device tapes
/// with the outputs' cotangent blocks: every device runs its tape backward (its pending psums
/// go through its context), reads its arguments' cotangent blocks, and the blocks are
/// assembled into the arguments' cotangents (sharded as their in_specs, as in JAX). Without an
/// outer tape (`outer` null) no node is made: the tapes only carry the vma forward.
struct ShardMapAd final : NodeBase {
  ShardMapAd(const Mesh& m, Tape* outer_tape, shard::source_location call_site)
      : NodeBase("shard_map"), mesh(m), outer(outer_tape), where(call_site) {
    const std::size_t n = m.local_device_ids().size();
    for (std::size_t li = 0; li < n; ++li) {
      tapes.push_back(std::make_unique<Tape>(true, outer ? outer->id() : 0));
      tapes.back()->set_axis_names(m.axis_names());
    }
    leaves.resize(n);
    outs.resize(n);
    out_vma.resize(n);
  }

  struct Arg {
    std::uint32_t vma = 0;
    bool tracked = false;
    std::function<void(int li, NodeBase* leaf)> read;  // on device li's thread, after its backward
    std::function<void()> push;                        // on the calling thread, after every device
  };

  // Defined by the autodiff layer with the nodes (src/autodiff/shard_map_links.cpp), for every dtype.
  /// Registers a prepared argument (before the body runs).
  template <Dtype T>
  void link(const ShardedArray<T>& p, const PartitionSpec& spec);
  /// Device li's block of argument `arg` (in link order): an alias, tracked on its tape.
  template <Dtype T>
  Tensor<T> block(const Tensor<T>& data, int li, std::size_t arg);
  /// The outer node of output array `y` (flat output f): its cotangent seeds the devices' tapes.
  template <Dtype T>
  void attach(ShardedArray<T>& y, std::size_t f, const std::shared_ptr<ShardMapAd>& self);

  /// Device li's block of output j (the next flat output): its node noted, its vma checked
  /// against the out_spec, its record removed (the assembled array is the outer tape's).
  template <Dtype T>
  void output(int li, Tensor<T>& r, std::size_t j, const PartitionSpec& spec) {
    const std::uint32_t mask = spec_axes_mask(mesh, spec);
    std::shared_ptr<NodeBase> node;
    if (const AdValue* a = ad_on(r, tapes[li].get())) {
      if (a->vma & ~mask) raise_output_varies(j, spec, a->vma & ~mask, mesh, outer != nullptr, where);
      node = a->node;
    }
    r.set_ad(nullptr);
    outs[li].push_back(std::move(node));
    out_vma[li].push_back(mask);
  }

  bool has_cotangent() const override { return seeded; }
  void backward(bool keep) override;  // src/spmd/shard_map_ad.cpp
  void reset() override { seeded = false; }

  Mesh mesh;
  Tape* outer;  ///< null: the forward vma check only
  shard::source_location where;
  std::vector<std::unique_ptr<Tape>> tapes;
  std::vector<Arg> args;
  std::vector<std::vector<std::shared_ptr<NodeBase>>> leaves;  // [device][argument]
  std::vector<std::vector<std::shared_ptr<NodeBase>>> outs;    // [device][flat output]
  std::vector<std::vector<std::uint32_t>> out_vma;             // [device][flat output]
  bool seeded = false;
};

/// What a shard_map's equations in a jit trace need of the autodiff layer when a grad inside the
/// jit differentiates it (jit(grad(f)): spmd/detail/shard_map_jit.hpp), for one dtype; defined
/// with the nodes (src/autodiff/shard_map_links.cpp). Non-floating arrays are never tracked.
template <Dtype T>
struct JitAdLinks {
  /// x as a leaf of `tape` (an alias; a non-floating array as it is).
  static ShardedArray<T> leaf(const ShardedArray<T>& x, Tape& tape);
  /// Adds ct to the cotangent of y's node on `tape` (nothing when y has none there).
  static void seed(const ShardedArray<T>& y, const ShardedArray<T>& ct, const Tape& tape);
  /// The cotangent the backward pass of its tape left at `leaf` (zeros when none), taken.
  static ShardedArray<T> cotangent(const ShardedArray<T>& leaf);
  /// True when x has a node on `tape`.
  static bool tracked(const ShardedArray<T>& x, const Tape& tape);
  /// Makes y a node of `tape` whose rule hands the cotangent it gets to `take`.
  static void collect(ShardedArray<T>& y, Tape& tape, std::function<void(const ShardedArray<T>&)> take);
  /// Pushes ct to x's node on `tape`.
  static void push(const ShardedArray<T>& x, const Tape& tape, const ShardedArray<T>& ct);
};

}  // namespace shard::detail
