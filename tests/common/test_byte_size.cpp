// parse_byte_size (fsdp/common/memory.h): the sizes users give flags, read
// exactly, and every other text refused with the flag's name.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "fsdp/common/error.h"
#include "fsdp/common/memory.h"

namespace fsdp {

TEST(ByteSize, ParsesSizes) {
  EXPECT_EQ(parse_byte_size("5GB", "--x"), 5000000000);
  EXPECT_EQ(parse_byte_size("500MB", "--x"), 500000000);
  EXPECT_EQ(parse_byte_size("2GiB", "--x"), 2147483648);
  EXPECT_EQ(parse_byte_size("1.5kB", "--x"), 1500);
  EXPECT_EQ(parse_byte_size("1234", "--x"), 1234);
  EXPECT_EQ(parse_byte_size("0", "--x"), 0);
  EXPECT_THROW(parse_byte_size("5 parsecs", "--x"), UsageError);
  EXPECT_THROW(parse_byte_size("lots", "--x"), UsageError);
  // Issue 50, finding 11: past 2^63 was garbage, 400 digits threw "stod", 1e-7 became 0 ("no limit").
  const auto refusal = [](const std::string& text, const std::string& zero) {
    try {
      parse_byte_size(text, "--x", zero);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(parse_byte_size("9223372036854775807", "--x"), INT64_MAX);
  EXPECT_THROW(parse_byte_size("8EiB", "--x"), UsageError);
  EXPECT_NE(refusal("9223372036854775808", "no limit").find("2^63 - 1 bytes"), std::string::npos);
  EXPECT_NE(refusal("99999999999999999999", "no limit").find("(0: no limit)"), std::string::npos);
  EXPECT_NE(refusal(std::string(400, '9'), "").find("largest size"), std::string::npos);
  EXPECT_NE(refusal("0.0000001", "stage nothing").find("less than one byte"), std::string::npos);
  EXPECT_NE(refusal("0.0000001", "stage nothing").find("(0: stage nothing)"), std::string::npos);
  EXPECT_EQ(refusal("lots", "").find("(0:"), std::string::npos) << "no meaning of 0 said where none was given";
  EXPECT_EQ(parse_byte_size("0.5", "--x"), 1) << "half a byte rounds to one";
  EXPECT_EQ(parse_byte_size("0.0", "--x"), 0);
}

}  // namespace fsdp
