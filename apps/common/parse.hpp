#pragma once
// The apps' parsers of flag values that need no runtime (parse.cpp; fuzzed by fuzz/fuzz_int_list.cpp).

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace shard::apps {

/// "784,1024,10" -> {784, 1024, 10}: comma-separated integers, each at least `min`; otherwise
/// ValueError "bad --<flag> '<text>': write sizes like <example>" (the same on every rank).
std::vector<std::int64_t> parse_int_list(const std::string& text, const std::string& flag, const std::string& example,
                                         std::int64_t min);

// One check per kind of flag value, each raising ValueError naming the flag (every rank parses
// the same command line, so every rank raises the same error).

/// `value` is one of `choices`, else "--<flag> '<value>': choose a, b or c".
void check_choice(const std::string& flag, const std::string& value, std::initializer_list<const char*> choices);

/// `value` >= `min`, else "--<flag> must be >= <min>, got <value>" (`note` appended if given).
void check_at_least(const std::string& flag, std::int64_t value, std::int64_t min, const std::string& note = "");

/// `value` finite and in [lo, hi], else "--<flag> must be a finite number in [lo, hi], got v".
void check_finite_in(const std::string& flag, double value, double lo, double hi);

/// --mesh "data=4,model=2" of the training apps -> {4, 2}; either axis may be left out (it
/// takes the rest of the `devices`; neither: data = all). ValueError when the text is bad or
/// the sizes do not multiply to `devices` (the same on every rank).
std::pair<int, int> parse_data_model_mesh(const std::string& text, int devices);

/// --mesh of train_gpt: "data=D,model=M" as parse_data_model_mesh, or a hybrid mesh
/// "replica=R,fsdp=F,model=M" (parameters split over 'fsdp' within a host, the batch over
/// ('replica', 'fsdp'); model left out: 1; one of replica and fsdp left out: the rest of the
/// devices). The axes' names and sizes in mesh order; ValueError as parse_data_model_mesh's.
std::pair<std::vector<std::string>, std::vector<int>> parse_training_mesh(const std::string& text,
                                                                          int devices);

/// The whole of `text` as a finite float (e.g. "1e-3"), else "bad --<flag> '<text>': write a
/// number like <example>".
double parse_finite(const std::string& text, const std::string& flag, const std::string& example);

}  // namespace shard::apps
