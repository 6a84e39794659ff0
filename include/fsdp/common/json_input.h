// JSON a user hands us: config.json, tokenizer.json, a safetensors header, a
// checkpoint manifest, a line of JSON-lines data.
//
// nlohmann's parser is iterative, but printing and walking a value recurse, so
// a file of 200,000 nested '[' would overflow the stack long after parsing; the
// nesting is bounded before parsing. Every parser error, a number past double's
// range (1e400) included, comes back as a reason that names the last key read.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <optional>
#include <string>
#include <string_view>

namespace fsdp {

// Deeper than any real file (tokenizer.json nests about 8 levels).
inline constexpr int kMaxJsonDepth = 256;

// The parsed value, or nullopt with `why` set to one line such as
// "nesting deeper than 256 levels at byte 300" or
// "[json.exception.out_of_range.406] number overflow parsing '1e400' (the value of \"vocab_size\")".
std::optional<nlohmann::json> parse_json_input(std::string_view text, std::string& why);

}  // namespace fsdp
