#pragma once
// train_mlp's data: Fashion-MNIST from the IDX files of Debian's dataset-fashion-mnist, or the
// synthetic regression set of JAX's tutorial. Each rank keeps the raw data set in memory
// (Fashion-MNIST: 47 MB of uint8 pixels) and builds only its own devices' rows of each batch.

#include <cstdint>
#include <string>
#include <vector>

#include "dataset.hpp"
#include "shard/shard.hpp"

namespace train {

/// Reads <dir>/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz (gzip, IDX big-endian headers).
/// Throws shard::IoError naming the file when it is missing or malformed.
Dataset read_fashion_mnist(const std::string& dir, bool train);
/// The tutorial's regression set: N(0,1) inputs and targets from `key`, identical on every rank.
Dataset synthetic(shard::random::Key key, std::int64_t count, std::int64_t features, std::int64_t outputs);

/// The batch rows [first, first + rows) of `order` as a P('data', None) array: inputs
/// [rows, features] and labels [rows, 1] (classification; -1 marks padding past `order`) or
/// targets [rows, outputs]. Each device fills only its own block (no communication).
shard::ShardedArray<float> batch_inputs(const Dataset& d, const std::vector<std::int64_t>& order, std::int64_t first,
                                        std::int64_t rows, const shard::NamedSharding& s);
shard::ShardedArray<float> batch_labels(const Dataset& d, const std::vector<std::int64_t>& order, std::int64_t first,
                                        std::int64_t rows, const shard::NamedSharding& s);

}  // namespace train
