// The command line's names for the library's options.
//
// The engine and the library name their own options in errors
// ("FsdpOptions::hybrid_shard_size 3 must divide the world size 4"); a user of
// fsdp-train or fsdp-inspect gave flags, so the programs say the flag instead
// ("--hybrid-shard-size 3 must divide ..."). The names come from the option
// table, whose rows say which field each binds (OptionRow::field), so that
// the library never needs to know the flags.
#pragma once

#include <functional>
#include <string>

namespace fsdp::cli {

// `message` with every library option name of the table replaced by its flag.
// A name is replaced wherever it appears, so a field must not be a prefix of a
// longer name the table does not hold.
std::string in_flag_terms(const std::string& message);

// Runs `body`; a UsageError or Failure it throws is thrown again in flag terms
// (as the same of the two: the exit code follows it).
int with_flag_names(const std::function<int()>& body);

}  // namespace fsdp::cli
