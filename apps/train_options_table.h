// fsdp-train's options, declared once (issue 38): one row per flag — its name,
// the value it binds, its help, its check, whether a --config file may set it
// (its TOML key is the flag without "--") and whether fsdp-inspect uses it.
//
// From this table fsdp-train registers its command line (and so --help, the
// --config keys and --print-config, which read the registered options);
// fsdp-inspect registers the rows it uses and accepts every other (ignored,
// said once); `fsdp-train --list-options` prints the table as JSON, against which
// tests hold docs/training.md's flag table and deploy/kubernetes/generate.py.
// Adding an option is one row here plus its use (docs/training.md, "Adding an
// option").
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "fsdp/train/options.h"

namespace fsdp::cli {

// What fsdp-train's command line sets besides TrainOptions and TrainFlags: the
// launcher, the modes, and words that run() types itself, with its defaults.
struct RunFlags {
  int nproc = 1;                      // --nproc-per-node
  int nnodes = 1;                     // --nnodes
  int node_rank = 0;                  // --node-rank
  std::string master_addr;            // --master-addr
  int master_port = 29500;            // --master-port (torchrun's default)
  std::string timeout;                // --timeout; "": not given
  std::string backend = "auto";       // --backend (comm::choose_backend)
  std::string profile_steps;          // --profile-steps A:B
  std::string config_file;            // --config
  bool print_config = false;          // --print-config
  bool list_metrics = false;          // --list-metrics
  bool list_options = false;          // --list-options
  bool eval_only = false;             // --eval-only
};

// Everything a row may bind: the trainer's typed options and the run's own flags.
struct TrainTargets {
  TrainTargets() { o.data.path = "embedded"; }  // the default --help shows; run() resolves it
  train::TrainOptions o;
  RunFlags run;
};

// A member given in words: the library's parse (a word into the member;
// UsageError for another) and its to_string (the member's word: the default
// --help and --list-options show). `repeat`: the row is repeatable and each
// word adds to the member (set(word, first) with first true for the first
// given, which clears what was there).
struct WordsTarget {
  std::function<void(const std::string& word, bool first)> set;
  std::function<std::string()> get;
  bool repeat = false;
};

// The value a row binds; its C++ type decides the CLI11 option (bool: a switch;
// a vector or a repeated WordsTarget: repeatable) and so its --config TOML type.
using OptionTarget =
    std::variant<int*, int64_t*, uint64_t*, double*, bool*, std::string*, std::vector<std::string>*, WordsTarget>;

// Whether fsdp-inspect reads the flag: kUses for what changes a plan or an
// estimate (model, sharding, precision, batch, cluster shape, ...); kIgnores:
// accepted so that a run's command line can be pasted, and named in one note.
enum class Inspect { kUses, kIgnores };

// Row traits (bits).
enum OptionTrait : unsigned {
  kShowDefault = 1u << 0,  // --help shows the default; --print-config prints it as a comment
  kNotInConfig = 1u << 1,  // command line only: no TOML key (--config, --print-config, ...)
};

struct OptionRow {
  std::string flag;   // "--seq-len"; a switch storing false when given: "!--no-shuffle"
  std::string group;  // "": the main list; else the title of its option group (kOptionGroups)
  std::string help;
  std::function<OptionTarget(TrainTargets&)> target;
  // The member it binds, as the library names it in its messages
  // ("DataOptions::seq_len", "FsdpOptions::mixed_precision.reduce_dtype"); ""
  // for the run's own flags (RunFlags). in_flag_terms maps these to the flag.
  std::string field;
  std::vector<std::string> choices;  // the accepted words (checked by CLI11); empty: any value
  unsigned traits = 0;
  Inspect inspect = Inspect::kIgnores;
  // Other names the library gives this option where a function takes it
  // outside TrainOptions: a struct's field ("LoraConfig::rank" for --lora-rank;
  // a launcher's for a RunFlags row) or a function's parameter
  // ("freeze_matching: pattern" for --freeze). in_flag_terms maps them to the flag too.
  std::vector<std::string> also;

  std::string name() const { return flag[0] == '!' ? flag.substr(1) : flag; }  // "--no-shuffle"
  // The --config key ("seq-len"), "" for a command-line-only option.
  std::string config_key() const { return (traits & kNotInConfig) != 0 ? "" : name().substr(2); }
};

// The table, in --help order.
const std::vector<OptionRow>& train_option_table();

// Adds every row to `app` (its option groups made in the table's order), bound
// into `t`, which must outlive the parse.
void register_train_options(CLI::App& app, TrainTargets& t);

// fsdp-inspect's side, after it declared its own options (--world-size,
// --estimate, ...): the rows marked kUses registered as register_train_options
// registers them, bound into `t` (fsdp-inspect reads the run from there, with
// fsdp-train's help texts and defaults), and every other row accepted and
// ignored (a switch stays a switch, a repeatable option repeatable, any other
// takes one value unchecked). Internal error when fsdp-inspect declared a flag
// of the table itself: each fsdp-train flag is declared once, in the table.
struct IgnoredOptions {
  std::vector<std::string> values;  // sink of the ignored values
  std::vector<std::pair<std::string, CLI::Option*>> options;  // flag, its option
  // The ignored flags given, in table order (e.g. "--lr, --data"); "" when none.
  std::string given() const;
};
void register_inspect_train_options(CLI::App& app, TrainTargets& t, IgnoredOptions& ignored);

// The table as JSON (an array of objects: flag, group, help, kind, type, default,
// choices, config_key, inspect), with the defaults of `app`, where
// register_train_options added the rows.
std::string train_options_json(const CLI::App& app);

}  // namespace fsdp::cli
