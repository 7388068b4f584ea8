// pmap's mesh and mapped size (spmd/pmap.hpp).

#include "shard/spmd/pmap.hpp"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "shard/error.hpp"
#include "shard/runtime/runtime.hpp"

namespace shard::detail {

Mesh pmap_mesh(int n, const std::string& name) {
  const Runtime& rt = Runtime::current();
  const Mesh all = make_mesh({rt.device_count()}, {name});
  if (n == rt.device_count()) return all;
  return Mesh({n}, {name}, std::vector<int>(all.device_ids().begin(), all.device_ids().begin() + n));
}

int pmap_size(const std::vector<std::pair<Shape, InAxis>>& args) {
  const int devices = Runtime::current().device_count();
  std::int64_t n = -1;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const auto& [shape, axis] = args[i];
    if (!axis.mapped()) continue;
    const int rank = static_cast<int>(shape.size());
    if (axis.axis() < -rank || axis.axis() >= rank)
      raise<ShapeError>("pmap: in_axes[", i, "] = ", axis.axis(), " is out of range for argument ", i,
                        " of shape ", to_string(shape));
    const std::int64_t size = shape[axis.axis() < 0 ? axis.axis() + rank : axis.axis()];
    if (n >= 0 && size != n)
      raise<ShapeError>("pmap: mapped dims of different sizes (", n, " and ", size, " for argument ", i,
                        "); every mapped argument needs the same size");
    n = size;
  }
  if (n < 0) raise<ValueError>("pmap: no argument is mapped (every in_axes entry is None)");
  if (n < 1 || n > devices)
    raise<ShapeError>("pmap: the mapped dim has size ", n, "; it must be between 1 and the device count (",
                      devices, ")");
  return static_cast<int>(n);
}

}  // namespace shard::detail
