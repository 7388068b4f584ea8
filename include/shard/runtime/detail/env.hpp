#pragma once
/// \file The environment variables Shard reads, each checked once where it enters: one parser
/// per kind of value, each raising RuntimeError that names the variable, the value and what is
/// accepted. An unset or empty variable gives std::nullopt (the caller's default).

#include <optional>
#include <string>

namespace shard::detail {

/// 1/0, on/off, true/false, yes/no (any case).
std::optional<bool> env_flag(const char* name);
/// A finite number of seconds in [0, max_seconds].
std::optional<double> env_seconds(const char* name, double max_seconds);
/// An integer in [min, max].
std::optional<long> env_integer(const char* name, long min, long max);

/// `text` as an integer in [min, max] (the whole text), else RuntimeError "<what> must be an
/// integer in [min, max], got '<text>'" (env_integer's parser, also for flags).
long parse_integer(const std::string& text, const std::string& what, long min, long max);

}  // namespace shard::detail
