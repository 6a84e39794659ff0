// The safetensors reader/writer and CRC-32C: round trips, a file built by hand
// byte by byte, and malformed files (every error names the file).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "fsdp/checkpoint/crc32c.h"
#include "fsdp/checkpoint/hf.h"
#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/common/error.h"
#include "support/multiproc.h"

namespace fsdp::checkpoint {
namespace {

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string u64le(uint64_t v) {
  std::string s(8, '\0');
  std::memcpy(s.data(), &v, 8);
  return s;
}

// A file from a header text and data bytes, the way the format says.
std::string make_file(const std::string& header, const std::string& data) {
  return u64le(header.size()) + header + data;
}

std::string expect_usage_error(const std::string& path) {
  try {
    SafetensorsFile f(path);
  } catch (const UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UsageError for " << path;
  return "";
}

}  // namespace

TEST(Crc32c, KnownVectorsAndExtension) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the standard check value
  EXPECT_EQ(crc32c("", 0), 0u);
  std::string zeros(32, '\0');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);  // RFC 3720 B.4
  std::string ff(32, '\xff');
  EXPECT_EQ(crc32c(ff.data(), ff.size()), 0x62A8AB43u);
  std::string big(100003, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + 7);
  const uint32_t whole = crc32c(big.data(), big.size());
  for (size_t cut : {size_t{0}, size_t{1}, size_t{7}, size_t{4096}, size_t{99999}}) {
    // unaligned starts and odd lengths
    EXPECT_EQ(crc32c_extend(crc32c(big.data(), cut), big.data() + cut, big.size() - cut), whole) << cut;
  }
}

TEST(Safetensors, RoundTripOfEveryFloatDtype) {
  const std::string dir = testing::temp_dir("st-roundtrip");
  const at::Tensor a = at::arange(12, at::kFloat).reshape({3, 4}) / 7;
  const at::Tensor b = (at::arange(6, at::kFloat) - 2.5).to(at::kBFloat16);
  const at::Tensor c = (at::arange(5, at::kFloat) * 0.1).to(at::kHalf);
  const at::Tensor e = at::zeros({0, 3});
  save_safetensors(dir + "/x.safetensors", {{"a", a}, {"layer.b", b}, {"c", c}, {"empty", e}}, {{"format", "pt"}});
  SafetensorsFile f(dir + "/x.safetensors");
  EXPECT_EQ(f.data_offset() % 8, 0);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  ASSERT_EQ(f.entries().size(), 4u);
  EXPECT_TRUE(at::equal(f.tensor("a"), a));
  EXPECT_TRUE(at::equal(f.tensor("layer.b"), b));
  EXPECT_TRUE(at::equal(f.tensor("c"), c));
  EXPECT_EQ(f.tensor("empty").sizes(), e.sizes());
  EXPECT_EQ(f.find("layer.b")->dtype, "BF16");
  EXPECT_EQ(f.find("c")->shape, std::vector<int64_t>{5});
  EXPECT_EQ(f.find("nope"), nullptr);
  // Element ranges, converted to fp32.
  std::vector<float> out(3);
  f.read_as_float(*f.find("a"), 5, 3, out.data());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out[i], a.reshape({-1})[5 + i].item<float>());
  f.read_as_float(*f.find("layer.b"), 1, 3, out.data());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out[i], b.to(at::kFloat)[1 + i].item<float>());
  f.read_as_float(*f.find("c"), 2, 3, out.data());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out[i], c.to(at::kFloat)[2 + i].item<float>());
}

// Built byte by byte from the format description (as Python's safetensors
// would write it): values must come back where the offsets say.
TEST(Safetensors, ReadsAFileMadeByHand) {
  const std::string dir = testing::temp_dir("st-hand");
  // w: F32 (2, 2) = [[1, 2], [3, 4]] at [0, 16); h: BF16 (3) = [1.0, -2.0, 0.5] at [16, 22)
  std::string header =
      R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"h":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]},"__metadata__":{"format":"pt"}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string data;
  for (float v : {1.0f, 2.0f, 3.0f, 4.0f}) data.append(reinterpret_cast<const char*>(&v), 4);
  for (uint16_t v : {uint16_t{0x3F80}, uint16_t{0xC000}, uint16_t{0x3F00}}) data.append(reinterpret_cast<const char*>(&v), 2);
  write_bytes(dir + "/hand.safetensors", make_file(header, data));
  SafetensorsFile f(dir + "/hand.safetensors");
  EXPECT_TRUE(at::equal(f.tensor("w"), at::tensor({1.0f, 2.0f, 3.0f, 4.0f}).reshape({2, 2})));
  std::vector<float> h(3);
  f.read_as_float(*f.find("h"), 0, 3, h.data());
  EXPECT_EQ(h, (std::vector<float>{1.0f, -2.0f, 0.5f}));
  // Our writer produces exactly this header for the same tensors (keys sorted, no spaces).
  const std::string ours = SafetensorsWriter::encode_header(
      {{"w", "F32", {2, 2}}, {"h", "BF16", {3}}}, {{"format", "pt"}});
  EXPECT_EQ(ours.size() % 8, 0u);
  EXPECT_EQ(nlohmann::json::parse(ours.substr(8)), nlohmann::json::parse(header));
}

TEST(Safetensors, MalformedFilesAreUsageErrorsNamingTheFile) {
  const std::string dir = testing::temp_dir("st-bad");
  const std::string ok_header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string data(8, '\0');
  struct Case {
    std::string name;
    std::string bytes;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"short", std::string(5, '\0'), "fewer than the 8-byte header length"},
      {"hugelen", u64le(1ull << 40) + ok_header + data, "exceeds the limit"},
      {"longlen", u64le(ok_header.size() + 100) + ok_header + data, "exceeds the file"},
      {"notjson", make_file("{not json", data), "not valid JSON"},
      {"notobject", make_file("[1,2]", data), "does not start with '{'"},
      {"dtype", make_file(R"({"a":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", data), "unknown dtype 'Q7'"},
      {"range", make_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", data), "out of range"},
      {"sizemismatch", make_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data), "needs 12 bytes"},
      {"overlap", make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data),
       "overlap"},
      {"backwards", make_file(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", data), "begin > end"},
      {"negshape", make_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data), "bad shape"},
      {"nooffsets", make_file(R"({"a":{"dtype":"F32","shape":[2]}})", data), "data_offsets"},
      // Found by tests/fuzz: 2^62 * 4 elements * 4 bytes wrapped to 0 and the file was accepted.
      {"sizeoverflow", make_file(R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})", data),
       "overflows 64 bits"},
  };
  for (const auto& c : cases) {
    const std::string path = dir + "/" + c.name + ".safetensors";
    write_bytes(path, c.bytes);
    const std::string msg = expect_usage_error(path);
    EXPECT_NE(msg.find(path), std::string::npos) << c.name << ": " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.name << ": " << msg;
  }
  // A truncated copy of a good file.
  save_safetensors(dir + "/good.safetensors", {{"x", at::ones({100})}});
  std::ifstream in(dir + "/good.safetensors", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  write_bytes(dir + "/cut.safetensors", all.substr(0, all.size() - 10));
  EXPECT_NE(expect_usage_error(dir + "/cut.safetensors").find("out of range"), std::string::npos);
}

TEST(Safetensors, ParsesDtypes) {
  EXPECT_EQ(parse_export_dtype("bf16"), at::kBFloat16);
  EXPECT_EQ(parse_export_dtype("float32"), at::kFloat);
  EXPECT_THROW(parse_export_dtype("int8"), UsageError);
}

}  // namespace fsdp::checkpoint
