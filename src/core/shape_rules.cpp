// The shape rules both views' primitive kernels share (shape_rules.hpp).

#include "core/shape_rules.hpp"

#include "shard/error.hpp"

namespace shard::detail {

std::vector<int> squeezed_dims(const Shape& shape, const Dims& dims) {
  const int rank = static_cast<int>(shape.size());
  std::vector<int> drop;
  if (dims.is_all()) {
    for (int d = 0; d < rank; ++d)
      if (shape[d] == 1) drop.push_back(d);
    return drop;
  }
  drop = dims.resolve(rank, "squeeze");
  for (int d : drop)
    if (shape[d] != 1)
      raise<ShapeError>("squeeze: dim ", d, " of shape ", to_string(shape), " has size ", shape[d],
                        ", not 1");
  return drop;
}

}  // namespace shard::detail
