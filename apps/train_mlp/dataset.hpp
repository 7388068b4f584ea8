#pragma once
// train_mlp's data set in memory, and the parser of Fashion-MNIST's IDX files (dataset.cpp).

#include <cstdint>
#include <string>
#include <vector>

namespace train {

/// A labelled set: `count` rows of `features` values; labels are class indices
/// (classification) or `outputs` target values per row (regression).
struct Dataset {
  std::int64_t count = 0, features = 0, outputs = 0;
  bool classify = true;
  std::vector<std::uint8_t> pixels;  ///< Fashion-MNIST rows (count x features), scaled on use
  std::vector<float> dense;          ///< synthetic rows (count x features)
  std::vector<float> targets;        ///< synthetic targets (count x outputs)
  std::vector<std::uint8_t> labels;  ///< class of each row

  /// Row `r` of the inputs as normalised floats into `out` (features values).
  void input_row(std::int64_t r, float* out) const;
};

/// read_fashion_mnist (data.hpp) from the decompressed bytes of the image and label files
/// (the paths name them in errors); fuzzed by fuzz/fuzz_idx.cpp.
Dataset parse_fashion_mnist(const std::vector<std::uint8_t>& images, const std::vector<std::uint8_t>& labels,
                            const std::string& image_path, const std::string& label_path);

}  // namespace train
