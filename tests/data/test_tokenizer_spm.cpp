// SentencePieceTokenizer: a small model trained in the test, Llama 2 style.
#include <gtest/gtest.h>

#include "data_test_util.h"
#include "fsdp/common/error.h"
#include "fsdp/data/tokenizer.h"

#include <sys/wait.h>

#include <fstream>
#include <memory>

using namespace fsdp::data;
using namespace fsdp::data::testing;

namespace {

// Text for training: English plus accented Latin, Greek, Cyrillic, CJK and emoji.
std::string training_text() {
  const char* lines[] = {
      "The quick brown fox jumps over the lazy dog.",
      "A small garden needs patient hands and a little water.",
      "Café au lait, crème brûlée and a slice of tarte Tatin.",
      "Die Katze schläft auf dem Sofa, und draußen regnet es.",
      "El río baja despacio entre los olivos, año tras año.",
      "東京の朝は静かです。駅のホームで人々は電車を待っています。",
      "山上的雪慢慢融化，小河又开始流动了。春天来了。",
      "Το φως του πρωινού έπεσε πάνω στη θάλασσα.",
      "Утром в деревне пахнет хлебом и дымом.",
      "Rain on a tin roof 🌧️ is the oldest music 🎶 in the world 🌍.",
      "Counting is harder than it looks: 1, 2, 3, 10, 100, 1024 and 65536.",
  };
  std::string text;
  for (int rep = 0; rep < 20; ++rep)
    for (const char* l : lines) text += std::string(l) + "\n";
  return text;
}

class SentencePieceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    write_file(dir_->file("train.txt"), training_text());
    // Llama 2's settings, scaled down: BPE, byte fallback, identity normalization,
    // whitespace kept, unk/bos/eos = 0/1/2.
    // spm_train (Debian package sentencepiece), not the trainer library: linking
    // libsentencepiece_train into a LibTorch program crashes (tokenizer_spm.cpp).
    const std::string cmd = "spm_train --input=" + dir_->file("train.txt") + " --model_prefix=" +
                            dir_->file("spm") +
                            " --vocab_size=600 --model_type=bpe --byte_fallback=true"
                            " --character_coverage=1.0 --normalization_rule_name=identity"
                            " --remove_extra_whitespaces=false --split_digits=true"
                            " --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1 > " +
                            dir_->file("spm_train.log") + " 2>&1";
    const int status = std::system(cmd.c_str());
    std::ifstream log(dir_->file("spm_train.log"));
    const std::string log_text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "spm_train failed (install Debian's sentencepiece package: scripts/deps.sh):\n" << log_text;
    model_ = dir_->file("spm.model");
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  static TempDir* dir_;
  static std::string model_;
};
TempDir* SentencePieceTest::dir_ = nullptr;
std::string SentencePieceTest::model_;

}  // namespace

TEST_F(SentencePieceTest, LoadsWithBosEosAndVocabFromTheModel) {
  SentencePieceTokenizer tok(model_);
  EXPECT_EQ(tok.vocab_size(), 600);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.name(), "sentencepiece:" + model_);
}

TEST_F(SentencePieceTest, RoundTripsNonAsciiText) {
  SentencePieceTokenizer tok(model_);
  const std::string cases[] = {
      "The quick brown fox jumps over the lazy dog.",
      "Café au lait, crème brûlée — déjà vu!",
      "東京の朝は静かです。",
      "山上的雪慢慢融化",
      "Утром в деревне пахнет хлебом.",
      "Rain 🌧️ and music 🎶 and the world 🌍",
      // Never seen in training: byte fallback must carry them.
      "Ωμέγα ∑ ∫ 🦀 한국어 ÆØÅ",
      "two  spaces,\ttab and\nnewline 12345",
  };
  for (const auto& text : cases) {
    const auto ids = tok.encode(text);
    EXPECT_FALSE(ids.empty()) << text;
    for (int32_t id : ids) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, tok.vocab_size());
    }
    EXPECT_EQ(tok.decode(ids), text);
  }
  // Learned merges make common words shorter than their bytes.
  EXPECT_LT(tok.encode("The quick brown fox").size(), std::string("The quick brown fox").size());
}

TEST_F(SentencePieceTest, MakeTokenizerDetectsTheProtobufAndDecodeDropsControls) {
  const auto tok = make_tokenizer(model_);
  EXPECT_EQ(tok->name(), "sentencepiece:" + model_);
  EXPECT_FALSE(looks_like_tiktoken_file(model_));
  auto ids = tok->encode("hello");
  ids.insert(ids.begin(), tok->bos_id());
  ids.push_back(tok->eos_id());
  EXPECT_EQ(tok->decode(ids), "hello");
  const auto msg = error_of<fsdp::UsageError>([&] { tok->decode({5, 600}); });
  EXPECT_CONTAINS(msg, "id 600 at position 1");
}
