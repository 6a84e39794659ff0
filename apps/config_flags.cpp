#include "config_flags.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <vector>

#include "fsdp/common/config_file.h"
#include "fsdp/common/error.h"

namespace fsdp::cli {

namespace {

constexpr const char* kFlag = "--config";

// Every option of `app` and of its option groups, in the order --help lists them.
void each_option(const CLI::App& app, const std::function<void(const CLI::Option&)>& fn) {
  for (const CLI::Option* opt : app.get_options()) fn(*opt);
  for (const CLI::App* group : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (group->get_name().empty()) each_option(*group, fn);
  }
}

// The option a key names ("seq-len" -> --seq-len), searching the option groups too.
CLI::Option* option_of(CLI::App& app, const std::string& key) {
  return key.empty() || key[0] == '-' ? nullptr : app.get_option_no_throw("--" + key);
}

bool is_switch(const CLI::Option& o) { return o.get_expected_min() == 0; }
bool is_repeatable(const CLI::Option& o) { return o.get_items_expected_max() > 1; }
bool starts(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// The TOML type a key of option `o` must have, in words, when `e` has another; "" when it fits.
std::string type_mismatch(const CLI::Option& o, const ConfigEntry& e) {
  const std::string type = o.get_type_name();
  const auto digits = [](const std::string& s) { return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos; };
  if (is_switch(o)) return e.type == ConfigType::kBool ? "" : "true or false";
  if (is_repeatable(o)) {
    const bool ok = e.type == ConfigType::kString || (e.type == ConfigType::kArray && (e.texts.empty() ||
                                                                                        e.element_type == ConfigType::kString));
    return ok ? "" : "an array of strings (or one string)";
  }
  if (starts(type, "INT") || starts(type, "UINT")) {
    // Past 2^63 - 1 (only an unsigned option's, --seed) TOML has no integer: a string of digits.
    const auto past_int64 = [&](const std::string& s) {
      return digits(s) && (s.size() > 19 || (s.size() == 19 && s > "9223372036854775807"));
    };
    const bool ok = e.type == ConfigType::kInteger ||
                    (starts(type, "UINT") && e.type == ConfigType::kString && past_int64(e.texts.front()));
    return ok ? "" : "an integer";
  }
  if (starts(type, "FLOAT")) return e.type == ConfigType::kInteger || e.type == ConfigType::kFloat ? "" : "a number";
  return e.type == ConfigType::kString ? "" : "a string";
}

// How the user would write `texts` for `o` in TOML.
std::string toml_value(const CLI::Option& o, const std::vector<std::string>& texts) {
  const std::string type = o.get_type_name();
  if (is_repeatable(o)) {
    std::string out = "[";
    for (size_t i = 0; i < texts.size(); ++i) out += (i ? ", " : "") + toml_string(texts[i]);
    return out + "]";
  }
  const std::string text = texts.empty() ? std::string() : texts.back();
  if (starts(type, "INT") || starts(type, "UINT")) {
    // Checked decimal (cli_numbers.h); past int64 (a --seed) only a string holds it.
    char* end = nullptr;
    errno = 0;
    (void)std::strtoll(text.c_str(), &end, 10);
    const bool fits = !text.empty() && end == text.c_str() + text.size() && errno != ERANGE;
    return fits ? text : toml_string(text);
  }
  if (starts(type, "FLOAT")) {
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    return !text.empty() && end == text.c_str() + text.size() ? toml_float(v) : toml_string(text);
  }
  return toml_string(text);
}

}  // namespace

void apply_config_file(CLI::App& app, const std::string& path, const std::vector<std::string>& ignored,
                       std::vector<std::string>* found_ignored) {
  for (const ConfigEntry& e : read_config_file(path, kFlag)) {
    const std::string at = detail::cat(kFlag, " ", path, " line ", e.line, ": ");
    CLI::Option* opt = option_of(app, e.key);
    FSDP_CHECK(opt != nullptr, at, "'", e.key, "' is not an option of fsdp-train (keys are the long flag names "
               "without '--', e.g. seq-len = 2048; see fsdp-train --help)");
    if (std::find(ignored.begin(), ignored.end(), "--" + e.key) != ignored.end()) {
      if (found_ignored != nullptr) found_ignored->push_back("--" + e.key);
      continue;
    }
    FSDP_CHECK(opt->get_configurable(), at, "'", e.key, "' cannot be set in a config file; give --", e.key,
               " on the command line");
    const std::string want = type_mismatch(*opt, e);
    FSDP_CHECK(want.empty(), at, "'", e.key, "' must be ", want, ", not ", to_string(e.type), " (e.g. ", e.key,
               " = ", is_switch(*opt) ? std::string("true") : toml_value(*opt, e.texts), ")");
    if (opt->count() > 0) continue;  // given on the command line: it wins
    if (e.type == ConfigType::kArray && e.texts.empty()) continue;  // `lr-scale = []`: none, as when left out
    try {
      if (is_switch(*opt)) {
        opt->add_result(opt->get_flag_value(e.key, e.texts.front()));
      } else {
        opt->add_result(e.texts);
      }
      opt->run_callback();  // its checks (choices, strict numbers) and its value
    } catch (const CLI::ParseError& err) {
      FSDP_CHECK(false, at, e.key, " = ", toml_value(*opt, e.texts), ": ", err.what());
    }
  }
}

std::string effective_config(const CLI::App& app, const std::string& mode) {
  std::string given = std::string(kEffectiveConfigMarker) + " (fsdp-train " + (mode.empty() ? "" : mode + " ") +
                      "--config FILE replays it)\n";
  std::string defaults = "# defaults of the options not given:\n";
  each_option(app, [&](const CLI::Option& o) {
    if (!o.get_configurable() || o.get_single_name().empty() || o.get_lnames().empty()) return;
    const std::string key = o.get_single_name();
    if (is_switch(o)) {
      if (o.count() == 0) {
        defaults += "# " + key + " = false\n";
        return;
      }
      // On in the switch's own sense: --no-shuffle given is `no-shuffle = true`,
      // though the value it stores is "false".
      const std::vector<std::string> r = o.reduced_results();
      const bool on = !r.empty() && r.back() == o.get_flag_value(key, "true");
      given += key + " = " + (on ? "true" : "false") + "\n";
      return;
    }
    if (o.count() > 0) {
      given += key + " = " + toml_value(o, o.reduced_results()) + "\n";
    } else if (!is_repeatable(o) && (!o.get_default_str().empty() || o.get_type_name() == "TEXT")) {
      defaults += "# " + key + " = " + toml_value(o, {o.get_default_str()}) + "\n";
    }
  });
  return given + defaults;
}

}  // namespace fsdp::cli
