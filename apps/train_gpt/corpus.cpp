#include "corpus.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "shard/error.hpp"

namespace gpt {

namespace fs = std::filesystem;

Corpus read_fortunes(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    shard::raise<shard::IoError>("--data-dir ", dir, " is not a directory (apt-get install fortunes gives ",
                                 "/usr/share/games/fortunes)");
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.is_symlink() || !e.is_regular_file()) continue;
    const std::string name = e.path().filename().string();
    if (name.ends_with(".dat")) continue;
    files.push_back(name);
  }
  if (ec) shard::raise<shard::IoError>("cannot list ", dir, ": ", ec.message());
  std::sort(files.begin(), files.end());
  Corpus c;
  for (const auto& name : files) {
    const std::string path = dir + "/" + name;
    std::ifstream in(path, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) shard::raise<shard::IoError>("cannot read ", path);
    ++c.files;
    std::size_t pos = 0, start = 0;
    auto flush = [&](std::size_t end) {
      if (end > start) {
        auto& out = c.fortunes % 10 == 9 ? c.validation : c.train;
        out.insert(out.end(), text.begin() + static_cast<std::ptrdiff_t>(start), text.begin() + static_cast<std::ptrdiff_t>(end));
        out.push_back('\n');
        ++c.fortunes;
      }
    };
    while (pos < text.size()) {  // one line [pos, eol)
      std::size_t eol = text.find('\n', pos);
      const std::size_t next = eol == std::string::npos ? text.size() : eol + 1;
      if (eol == std::string::npos) eol = text.size();
      if (eol - pos == 1 && text[pos] == '%') {
        flush(pos);
        start = next;
      }
      pos = next;
    }
    flush(text.size());
  }
  if (c.train.empty() || c.validation.empty())
    shard::raise<shard::IoError>(dir, " holds ", c.fortunes, " fortunes in ", c.files,
                                 " files: too few for a training and a validation split (apt-get install fortunes)");
  return c;
}

}  // namespace gpt
