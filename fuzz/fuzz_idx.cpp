// libFuzzer target: train_mlp's IDX reader (Fashion-MNIST images and labels, after gunzip).
// The input is split into the image file and the label file at its first 4 bytes' offset.
#include <cstdint>
#include <cstring>
#include <vector>

#include "shard/error.hpp"
#include "train_mlp/dataset.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 4) return 0;
  std::uint32_t cut = 0;
  std::memcpy(&cut, data, 4);
  const std::size_t rest = size - 4, at = rest == 0 ? 0 : cut % (rest + 1);
  const std::vector<std::uint8_t> images(data + 4, data + 4 + at), labels(data + 4 + at, data + size);
  try {
    const train::Dataset d = train::parse_fashion_mnist(images, labels, "images", "labels");
    if (d.count > 0) {
      std::vector<float> row(static_cast<std::size_t>(d.features));
      d.input_row(d.count - 1, row.data());  // the last row must lie inside the pixels
    }
  } catch (const shard::Error&) {
  }
  return 0;
}
