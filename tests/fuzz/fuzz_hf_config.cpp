// Fuzz target: a Hugging Face config.json (what --model and --init-from read):
// both families' readers, models::parse_hf_config (Llama) and
// models::parse_t5_config (T5), on every input. Input: the file's bytes.
// Promises checked on a config a reader accepts: the summary and parameter
// count are computed without overflow (UBSan), and the config.json we export
// for it (--export-hf) reads back as the same model.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fsdp/models/registry.h"
#include "fsdp/models/t5_config.h"
#include "fuzz_util.h"

namespace {

using fsdp::fuzz::fuzz_require;
using fsdp::models::LlamaConfig;

bool same_model(const LlamaConfig& a, const LlamaConfig& b) {
  const bool rope_same = a.rope_scaling.has_value() == b.rope_scaling.has_value() &&
                         (!a.rope_scaling || (a.rope_scaling->factor == b.rope_scaling->factor &&
                                              a.rope_scaling->low_freq_factor == b.rope_scaling->low_freq_factor &&
                                              a.rope_scaling->high_freq_factor == b.rope_scaling->high_freq_factor &&
                                              a.rope_scaling->original_max_position_embeddings ==
                                                  b.rope_scaling->original_max_position_embeddings));
  return a.model_type == b.model_type && a.hidden_size == b.hidden_size &&
         a.intermediate_size == b.intermediate_size && a.num_attention_heads == b.num_attention_heads &&
         a.num_key_value_heads == b.num_key_value_heads && a.dh() == b.dh() &&
         a.num_hidden_layers == b.num_hidden_layers && a.vocab_size == b.vocab_size &&
         a.max_position_embeddings == b.max_position_embeddings && a.rms_norm_eps == b.rms_norm_eps &&
         a.rope_theta == b.rope_theta && rope_same && a.tie_word_embeddings == b.tie_word_embeddings &&
         a.initializer_range == b.initializer_range && a.sliding_window == b.sliding_window &&
         a.layer_types == b.layer_types && a.attention_bias == b.attention_bias && a.pad_token_id == b.pad_token_id &&
         a.bos_token_id == b.bos_token_id && a.eos_token_id == b.eos_token_id;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  fsdp::fuzz::expect_documented_errors([&] {
    const LlamaConfig c = fsdp::models::parse_hf_config(text, "fuzz/config.json");
    fuzz_require(!c.summary().empty(), "an accepted config has a summary");
    fuzz_require(c.num_parameters() > 0, "an accepted config has parameters");
    const std::string exported = c.to_hf_config_json();
    LlamaConfig back;
    try {
      back = fsdp::models::parse_hf_config(exported, "fuzz/exported/config.json");
    } catch (const fsdp::UsageError& e) {
      fsdp::fuzz::finding(std::string("the exported config.json is refused on reading: ") + e.what() + "\n" + exported);
    }
    fuzz_require(same_model(c, back), "the exported config.json reads back as the same model:\n" + exported);
  });
  fsdp::fuzz::expect_documented_errors([&] {
    const fsdp::models::T5Config c = fsdp::models::parse_t5_config(text, "fuzz/config.json");
    fuzz_require(!c.summary().empty(), "an accepted T5 config has a summary");
    fuzz_require(c.num_parameters() > 0, "an accepted T5 config has parameters");
    const std::string exported = c.to_hf_config_json();
    fsdp::models::T5Config back;
    try {
      back = fsdp::models::parse_t5_config(exported, "fuzz/exported/config.json");
    } catch (const fsdp::UsageError& e) {
      fsdp::fuzz::finding(std::string("the exported T5 config.json is refused on reading: ") + e.what() + "\n" +
                          exported);
    }
    fuzz_require(fsdp::models::t5_config_mismatch(c, back).empty() && c.eos_token_id == back.eos_token_id &&
                     c.dropout_rate == back.dropout_rate,
                 "the exported T5 config.json reads back as the same model:\n" + exported);
  });
  return 0;
}
