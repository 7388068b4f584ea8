#pragma once
// train_gpt's text: the English fortunes of Debian's `fortunes` package, byte-tokenised.
//
// The rule (benchmarks/torch_gpt.py reads the same bytes): the regular files of the directory
// whose names do not end in ".dat" (symlinks skipped), sorted by name; each split into fortunes
// at lines holding only "%"; empty fortunes dropped; fortune k (counted over all files) goes
// to validation when k % 10 == 9, else to training; each split is its fortunes' bytes, each
// followed by one "\n". Tokens are the bytes (a vocabulary of 256).

#include <cstdint>
#include <string>
#include <vector>

namespace gpt {

struct Corpus {
  std::vector<std::uint8_t> train, validation;
  std::int64_t fortunes = 0, files = 0;
};

/// Reads the corpus from `dir`. Throws shard::IoError naming the directory or file when it
/// cannot be read or holds no text (install Debian's `fortunes` package).
Corpus read_fortunes(const std::string& dir);

}  // namespace gpt
