// The device tapes of a shard_map body (detail/shard_map_ad.hpp): the vma check of its
// outputs, the psums of the transposes, and the backward pass of a differentiated shard_map.

#include "shard/spmd/detail/shard_map_ad.hpp"

#include <string>
#include <utility>
#include <vector>

#include "shard/spmd/shard_map.hpp"

namespace shard::detail {

std::uint32_t spec_axes_mask(const Mesh& mesh, const PartitionSpec& spec) {
  std::uint32_t m = 0;
  for (const auto& name : spec.axes()) m |= 1u << mesh.axis_position(name);
  return m;
}

namespace {
std::string mask_names(std::uint32_t m, const Mesh& mesh) {
  std::string out;
  for (std::size_t k = 0; k < mesh.axis_names().size(); ++k)
    if (m >> k & 1u) out += (out.empty() ? "'" : ", '") + mesh.axis_names()[k] + "'";
  return out;
}
}  // namespace

void raise_output_varies(std::size_t j, const PartitionSpec& spec, std::uint32_t extra, const Mesh& mesh,
                         bool differentiated, const shard::source_location& where) {
  raise<ValueError>(
      "shard_map", differentiated ? " (differentiated)" : "", " called at ", where.file_name(), ":",
      where.line(), ": output ", j, " has out_spec ", spec.to_string(), ", which omits mesh axis ",
      mask_names(extra, mesh),
      ", but the body's output varies over it (it depends on an argument sharded over that axis "
      "without a psum over it), so each device would return a different value; psum (or pmean) "
      "the output over ",
      mask_names(extra, mesh), " or name the axis in the out_spec, as JAX's check_vma requires",
      differentiated ? "" : " (ShardMapOptions{.check_vma = false} skips the check)");
}

template <Dtype T>
Tensor<T> tape_psum(Tape& tape, Tensor<T> x, std::uint32_t axes) {
  std::vector<std::string> names;
  for (std::size_t k = 0; k < tape.axis_names().size(); ++k)
    if (axes >> k & 1u) names.push_back(tape.axis_names()[k]);
  if (!tape.context()) raise<Error>("autodiff: a device tape without a device context (internal error)");
  return tape.context()->psum(std::move(x), SpecEntry(std::move(names)));
}
#define SHARD_INSTANTIATE_TAPE_PSUM(T) template Tensor<T> tape_psum<T>(Tape&, Tensor<T>, std::uint32_t);
SHARD_FOR_EACH_FLOAT_DTYPE(SHARD_INSTANTIATE_TAPE_PSUM)
#undef SHARD_INSTANTIATE_TAPE_PSUM

void ShardMapAd::backward(bool keep) {
  if (seeded) {
    run_on_devices(mesh, [&](DeviceContext& ctx) {
      const int li = ctx.local_index();
      Tape& t = *tapes[static_cast<std::size_t>(li)];
      t.set_context(&ctx);
      t.backward(keep);
      Pause pause;
      for (std::size_t a = 0; a < args.size(); ++a)
        if (args[a].tracked) args[a].read(li, leaves[static_cast<std::size_t>(li)][a].get());
      if (keep) t.reset();
    });
    for (auto& a : args)
      if (a.tracked) a.push();
  }
  seeded = false;
  if (!keep) {  // frees the device tapes and their residuals
    tapes.clear();
    args.clear();
    leaves.clear();
    outs.clear();
  }
}

}  // namespace shard::detail
