#include "data.hpp"

#include <zlib.h>

#include <cstring>

namespace train {

namespace {


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


}  // namespace

Dataset read_fashion_mnist(const std::string& dir, bool train) {
  const std::string prefix = dir + "/" + (train ? "train" : "t10k");
  const std::string image_path = prefix + "-images-idx3-ubyte.gz", label_path = prefix + "-labels-idx1-ubyte.gz";
  const std::vector<std::uint8_t> images = read_gz(image_path);  // the images first: a missing set names them
  return parse_fashion_mnist(images, read_gz(label_path), image_path, label_path);
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
        t.flat(r) = d.labels[static_cast<std::size_t>(row)];
      else
        std::memcpy(t.data() + r * width, d.targets.data() + row * width, static_cast<std::size_t>(width) * sizeof(float));
    }
    return t;
  });
}

}  // namespace train
