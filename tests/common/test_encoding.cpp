#include <gtest/gtest.h>

#include "fsdp/common/encoding.h"

TEST(Encoding, Base64RoundTripsAndRejectsMalformedInput) {
  EXPECT_EQ(fsdp::base64_encode(""), "");
  EXPECT_EQ(fsdp::base64_encode("f"), "Zg==");
  EXPECT_EQ(fsdp::base64_encode("fo"), "Zm8=");
  EXPECT_EQ(fsdp::base64_encode("foobar"), "Zm9vYmFy");  // RFC 4648 test vectors
  std::string all;
  for (int c = 0; c < 256; ++c) all.push_back(static_cast<char>(c));
  for (size_t n = 0; n <= all.size(); n += 37) {
    const std::string part = all.substr(0, n);
    EXPECT_EQ(fsdp::base64_decode(fsdp::base64_encode(part)), part) << n;
  }
  EXPECT_EQ(fsdp::base64_decode("Zm8"), "fo");  // padding optional
  EXPECT_FALSE(fsdp::base64_decode("Zm9v!"));   // outside the alphabet
  EXPECT_FALSE(fsdp::base64_decode("Z=g="));    // '=' before the end
  EXPECT_FALSE(fsdp::base64_decode("Zm9vY"));   // a dangling character
}

TEST(Encoding, SplitMixAndFnvKnownValues) {
  EXPECT_EQ(fsdp::splitmix64(0), 0xe220a8397b1dcdafull);  // first output of SplitMix64 seeded with 0
  EXPECT_EQ(fsdp::fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(fsdp::fnv1a64("a"), 0xaf63dc4c8601ec8cull);
}
