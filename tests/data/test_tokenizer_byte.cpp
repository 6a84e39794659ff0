// ByteTokenizer and make_tokenizer's dispatch and errors.
#include <gtest/gtest.h>

#include "data_test_util.h"
#include "fsdp/common/error.h"
#include "fsdp/data/tokenizer.h"

using namespace fsdp::data;
using namespace fsdp::data::testing;

TEST(ByteTokenizer, RoundTripsAnyBytes) {
  ByteTokenizer tok;
  const std::string text = "Héllo, 世界! 👋\n\ttabs and \xff\xfe invalid UTF-8";
  const auto ids = tok.encode(text);
  ASSERT_EQ(ids.size(), text.size());
  for (size_t i = 0; i < text.size(); ++i) EXPECT_EQ(ids[i], static_cast<unsigned char>(text[i]));
  EXPECT_EQ(tok.decode(ids), text);
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(tok.decode(tok.encode(all)), all);
  EXPECT_TRUE(tok.encode("").empty());
}

TEST(ByteTokenizer, SpecialsFitTheTinyModel) {
  ByteTokenizer tok;
  EXPECT_EQ(tok.bos_id(), 256);
  EXPECT_EQ(tok.eos_id(), 257);
  EXPECT_EQ(tok.vocab_size(), 258);
  EXPECT_LE(tok.vocab_size(), 512);
  EXPECT_EQ(tok.name(), "byte");
  EXPECT_EQ(tok.decode({tok.bos_id(), 'h', 'i', tok.eos_id()}), "<|begin_of_text|>hi<|end_of_text|>");
  // Special text in the input is ordinary text.
  for (int32_t id : tok.encode("<|end_of_text|>")) EXPECT_LT(id, 256);
}

TEST(ByteTokenizer, DecodeRejectsIdsOutsideTheVocabulary) {
  ByteTokenizer tok;
  const auto msg = error_of<fsdp::UsageError>([&] { tok.decode({104, 300}); });
  EXPECT_CONTAINS(msg, "id 300 at position 1");
  EXPECT_CONTAINS(msg, "[0, 258)");
}

TEST(MakeTokenizer, ByteAndErrors) {
  EXPECT_EQ(make_tokenizer("byte")->name(), "byte");
  TempDir dir;
  auto msg = error_of<fsdp::UsageError>([&] { make_tokenizer(dir.file("nope.model")); });
  EXPECT_CONTAINS(msg, "nope.model");
  EXPECT_CONTAINS(msg, "neither \"byte\" nor an existing file");
  msg = error_of<fsdp::UsageError>([&] { make_tokenizer(dir.path()); });  // a model directory without one
  EXPECT_CONTAINS(msg, "has neither tokenizer.json nor tokenizer.model");
  msg = error_of<fsdp::UsageError>([&] { make_tokenizer(""); });
  EXPECT_CONTAINS(msg, "empty tokenizer spec");
  write_file(dir.file("tokenizer.json"), "{}");
  msg = error_of<fsdp::UsageError>([&] { make_tokenizer(dir.file("tokenizer.json")); });
  EXPECT_CONTAINS(msg, "tokenizer.json");
  write_file(dir.file("empty.model"), "");
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { make_tokenizer(dir.file("empty.model")); }), "empty.model' is empty");
  write_file(dir.file("garbage.model"), "this is not a tokenizer\n");
  msg = error_of<fsdp::UsageError>([&] { make_tokenizer(dir.file("garbage.model")); });
  EXPECT_CONTAINS(msg, "garbage.model");
  EXPECT_CONTAINS(msg, "neither a tiktoken BPE file");
}
