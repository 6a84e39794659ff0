// A --config file's keys as the command line's flags: fsdp-train's --config
// FILE and --print-config on CLI11. The file is read by the library's TOML
// reader (fsdp/common/config_file.h, Note [Config files]); here each key is
// checked against the options of the CLI11 command line it configures and
// applied as its flag, and the effective configuration is written back as
// TOML that reads back unchanged.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace fsdp::cli {

// Applies TOML file `path` to `app`, after app.parse(): each key that names a
// configurable option not given on the command line (flags given there win)
// is added to it and its checks run, as if given as a flag. UsageError naming
// --config, the file, the line and the key: an unknown key, a non-configurable
// one (config, print-config, help, version), a value of the wrong TOML type,
// one the option's checks refuse; and read_config_file's errors.
// `ignored`: keys that name options of fsdp-train this program accepts and
// ignores (fsdp-inspect's): checked to be fsdp-train's, not applied; each one
// found is added to `found_ignored` (when given), in the file's order.
void apply_config_file(CLI::App& app, const std::string& path, const std::vector<std::string>& ignored = {},
                       std::vector<std::string>* found_ignored = nullptr);

// The effective configuration as a --config file: the options given (on the
// command line or in --config) as keys, every other option's default as a
// comment. Defaults stay comments because a key counts as given: replaying
// `model = "tiny"` beside --init-from, or `timeout = ""`, would change the run.
// `mode` is the subcommand the run was given ("", "eval", "convert"), named in
// the header line so that the replay command is complete.
std::string effective_config(const CLI::App& app, const std::string& mode);

}  // namespace fsdp::cli
