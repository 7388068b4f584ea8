// train_mlp's data set in memory and the IDX format it comes in: no MPI and no arrays, so the
// parser of the files is fuzzed on its own (fuzz/fuzz_idx.cpp).

#include "dataset.hpp"

#include <cstring>

#include "shard/error.hpp"

namespace train {

namespace {

// Fashion-MNIST pixel statistics over the training set, for zero-mean unit-variance inputs.
constexpr float kMean = 0.2860f, kStd = 0.3530f;

std::uint32_t big_endian(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}

}  // namespace

void Dataset::input_row(std::int64_t r, float* out) const {
  if (!pixels.empty()) {
    const std::uint8_t* p = pixels.data() + r * features;
    for (std::int64_t j = 0; j < features; ++j) out[j] = (static_cast<float>(p[j]) * (1.0f / 255.0f) - kMean) / kStd;
  } else {
    std::memcpy(out, dense.data() + r * features, static_cast<std::size_t>(features) * sizeof(float));
  }
}

Dataset parse_fashion_mnist(const std::vector<std::uint8_t>& images, const std::vector<std::uint8_t>& labels,
                            const std::string& image_path, const std::string& label_path) {
  if (images.size() < 16 || big_endian(images.data()) != 0x803)
    shard::raise<shard::IoError>(image_path, " is not an IDX file of uint8 images (magic 0x00000803)");
  if (labels.size() < 8 || big_endian(labels.data()) != 0x801)
    shard::raise<shard::IoError>(label_path, " is not an IDX file of uint8 labels (magic 0x00000801)");
  Dataset d;
  d.count = big_endian(images.data() + 4);
  d.outputs = 10;
  std::int64_t pixels = 0;  // the header's sizes are 32-bit each: their product can overflow
  if (__builtin_mul_overflow(std::int64_t{big_endian(images.data() + 8)}, std::int64_t{big_endian(images.data() + 12)},
                             &d.features) ||
      __builtin_mul_overflow(d.count, d.features, &pixels))
    shard::raise<shard::IoError>(image_path, " has a header of impossible sizes (", d.count, " images of ",
                                 big_endian(images.data() + 8), " x ", big_endian(images.data() + 12), ")");
  if (d.features == 0 && d.count > 0)  // found by fuzz/fuzz_idx: images of 0 x 28 pixels
    shard::raise<shard::IoError>(image_path, " has images of ", big_endian(images.data() + 8), " x ",
                                 big_endian(images.data() + 12), " pixels: a model needs at least one input");
  if (big_endian(labels.data() + 4) != d.count)
    shard::raise<shard::IoError>(label_path, " has ", big_endian(labels.data() + 4), " labels for ", d.count, " images");
  if (static_cast<std::int64_t>(images.size()) - 16 != pixels ||
      static_cast<std::int64_t>(labels.size()) != 8 + d.count)
    shard::raise<shard::IoError>(image_path, " or ", label_path, " is truncated");
  d.pixels.assign(images.begin() + 16, images.end());
  d.labels.assign(labels.begin() + 8, labels.end());
  for (auto l : d.labels)
    if (l >= 10) shard::raise<shard::IoError>(label_path, " has a label ", int{l}, " outside 0..9");
  return d;
}

}  // namespace train
