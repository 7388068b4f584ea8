#include "data.hpp"

#include <zlib.h>

#include <cstring>

namespace train {

namespace {

// Fashion-MNIST pixel statistics over the training set, for zero-mean unit-variance inputs.
constexpr float kMean = 0.2860f, kStd = 0.3530f;

std::vector<std::uint8_t> read_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f)
    shard::raise<shard::IoError>("cannot open ", path,
                                 " (install Debian's dataset-fashion-mnist or point --data-dir at the IDX .gz files)");
  std::vector<std::uint8_t> out;
  std::uint8_t buf[1 << 16];
  int n = 0;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.insert(out.end(), buf, buf + n);
  const bool bad = n < 0;
  gzclose(f);
  if (bad) shard::raise<shard::IoError>("cannot decompress ", path);
  return out;
}

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

Dataset read_fashion_mnist(const std::string& dir, bool train) {
  const std::string prefix = dir + "/" + (train ? "train" : "t10k");
  const std::string image_path = prefix + "-images-idx3-ubyte.gz", label_path = prefix + "-labels-idx1-ubyte.gz";
  std::vector<std::uint8_t> images = read_gz(image_path), labels = read_gz(label_path);
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

Dataset synthetic(shard::random::Key key, std::int64_t count, std::int64_t features, std::int64_t outputs) {
  Dataset d;
  d.classify = false;
  d.count = count;
  d.features = features;
  d.outputs = outputs;
  const auto keys = shard::random::split(key, 2);
  const shard::Tensor<float> x =
      shard::random::normal_box<float>(keys[0], {count, features}, shard::Box{{0, 0}, {count, features}});
  const shard::Tensor<float> y =
      shard::random::normal_box<float>(keys[1], {count, outputs}, shard::Box{{0, 0}, {count, outputs}});
  d.dense.assign(x.begin(), x.end());
  d.targets.assign(y.begin(), y.end());
  return d;
}

shard::ShardedArray<float> batch_inputs(const Dataset& d, const std::vector<std::int64_t>& order, std::int64_t first,
                                        std::int64_t rows, const shard::NamedSharding& s) {
  return shard::generate<float>({rows, d.features}, s, [&](const shard::Box& b) {
    shard::Tensor<float> t(b.extent, 0.0f);
    for (std::int64_t r = 0; r < b.extent[0]; ++r) {
      const std::int64_t i = first + b.offset[0] + r;
      if (i < static_cast<std::int64_t>(order.size())) d.input_row(order[static_cast<std::size_t>(i)], t.data() + r * d.features);
    }
    return t;
  });
}

shard::ShardedArray<float> batch_labels(const Dataset& d, const std::vector<std::int64_t>& order, std::int64_t first,
                                        std::int64_t rows, const shard::NamedSharding& s) {
  const std::int64_t width = d.classify ? 1 : d.outputs;
  return shard::generate<float>({rows, width}, s, [&](const shard::Box& b) {
    shard::Tensor<float> t(b.extent, d.classify ? -1.0f : 0.0f);
    for (std::int64_t r = 0; r < b.extent[0]; ++r) {
      const std::int64_t i = first + b.offset[0] + r;
      if (i >= static_cast<std::int64_t>(order.size())) continue;
      const std::int64_t row = order[static_cast<std::size_t>(i)];
      if (d.classify)
        t[r] = d.labels[static_cast<std::size_t>(row)];
      else
        std::memcpy(t.data() + r * width, d.targets.data() + row * width, static_cast<std::size_t>(width) * sizeof(float));
    }
    return t;
  });
}

}  // namespace train
