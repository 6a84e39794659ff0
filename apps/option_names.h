// The command line's names for the library's options.
//
// The engine and the library name their own options in errors
// ("FsdpOptions::hybrid_shard_size 3 must divide the world size 4"); a user of
// fsdp-train or fsdp-inspect gave flags, so the programs say the flag instead
// ("--hybrid-shard-size 3 must divide ..."). The table lives here, beside the
// flags, so that the library never needs to know them.
#pragma once

#include <functional>
#include <string>

namespace fsdp::cli {

// `message` with every library option name of the table replaced by its flag.
std::string in_flag_terms(const std::string& message);

// Runs `body`; a UsageError it throws is thrown again in flag terms.
int with_flag_names(const std::function<int()>& body);

}  // namespace fsdp::cli
