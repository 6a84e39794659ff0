// The restricted pickle reader and writer (Note [Restricted pickle]) and DCP's
// .metadata on top of it: real files written by PyTorch 2.11 (the fuzz seeds
// of tests/fuzz/make_seeds.py), round trips, and hostile pickles: a foreign
// class, deep nesting, a huge length or memo index, a cycle, truncation.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include <caffe2/serialize/inline_container.h>

#include "dcp_format.h"
#include "fsdp/checkpoint/pickle.h"
#include "support/errors.h"

namespace fsdp::checkpoint {
namespace {

using pickle::Kind;
using pickle::PickleError;

std::string seed(const std::string& target, const std::string& name) {
  const std::string path = std::string(FSDP_SOURCE_DIR) + "/tests/fuzz/corpus/" + target + "/" + name;
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string pickle_error(const std::string& bytes, const pickle::AllowList& allowed = {}) {
  return testing::error_of<PickleError>([&] { pickle::read(bytes, allowed, "test.pkl"); });
}

// A torch.save archive around `pkl` as its data.pkl (no tensor data), as a DCP item holds it.
std::string archive_of(const std::string& pkl) {
  std::string bytes;
  caffe2::serialize::PyTorchStreamWriter zip([&](const void* p, size_t n) {
    bytes.append(static_cast<const char*>(p), n);
    return n;
  });
  zip.writeRecord("data.pkl", pkl.data(), pkl.size());
  zip.writeRecord("byteorder", "little", 6);
  zip.writeEndOfFile();
  return bytes;
}

dcp::ReadAt reader_of(const std::string& bytes) {
  return [&bytes](int64_t off, int64_t n, void* dst) { std::memcpy(dst, bytes.data() + off, static_cast<size_t>(n)); };
}

// EMPTY_TUPLE, then `n` times DUP + TUPLE2: 2^n leaves as a tree in 2 + 1 + 2n + 1 bytes (issue 50, finding 4).
std::string shared_tuples(int n) {
  std::string pkl("\x80\x02)", 3);
  for (int i = 0; i < n; ++i) pkl += "2\x86";
  return pkl + ".";
}

}  // namespace

TEST(Pickle, ReadsWhatPyTorchWroteInProtocols2To5) {
  for (const char* name : {"metadata_adamw", "metadata_protocol2", "metadata_protocol5"}) {
    const dcp::Metadata m = dcp::parse_metadata(seed("dcp_metadata", name), name);
    ASSERT_EQ(m.tensors.count("model.0.weight"), 1u) << name;
    const dcp::TensorMeta& w = m.tensors.at("model.0.weight");
    EXPECT_EQ(w.dtype, at::kFloat);
    EXPECT_EQ(w.size, (std::vector<int64_t>{4, 3}));
    ASSERT_EQ(w.chunks.size(), 1u);
    EXPECT_EQ(w.chunks[0].sizes, (std::vector<int64_t>{4, 3}));
    EXPECT_EQ(m.tensors.at("optimizer.state.0.weight.step").size, std::vector<int64_t>{});
    EXPECT_EQ(m.tensors.at("optimizer.state.2.bias.exp_avg_sq").size, std::vector<int64_t>{2});
    EXPECT_NE(std::find(m.bytes.begin(), m.bytes.end(), "optimizer.param_groups.0.lr"), m.bytes.end());
    EXPECT_EQ(m.planner_data.at("optimizer.param_groups.0.lr"),
              (std::vector<std::string>{"optimizer", "param_groups", "0", "lr"}));
    EXPECT_EQ(m.version, "1.0.0");
    const dcp::StorageInfo& s = m.storage.at({"model.0.weight", true, {0, 0}});
    EXPECT_EQ(s.relative_path, "__0_0.distcp");
    EXPECT_GT(s.length, 0);
  }
}

TEST(Pickle, MetadataRoundTripsThroughTheWriter) {
  const dcp::Metadata m = dcp::parse_metadata(seed("dcp_metadata", "metadata_adamw"), "seed");
  const dcp::Metadata again = dcp::parse_metadata(dcp::write_metadata(m, "/ckpt", "id"), "rewritten");
  ASSERT_EQ(again.tensors.size(), m.tensors.size());
  for (const auto& [k, t] : m.tensors) {
    EXPECT_EQ(again.tensors.at(k).size, t.size) << k;
    EXPECT_EQ(again.tensors.at(k).dtype, t.dtype) << k;
    ASSERT_EQ(again.tensors.at(k).chunks.size(), t.chunks.size()) << k;
  }
  EXPECT_EQ(again.bytes.size(), m.bytes.size());
  EXPECT_EQ(again.storage.size(), m.storage.size());
  for (const auto& [k, s] : m.storage) {
    EXPECT_EQ(again.storage.at(k).offset, s.offset) << k.fqn;
    EXPECT_EQ(again.storage.at(k).length, s.length) << k.fqn;
  }
  EXPECT_EQ(again.planner_data, m.planner_data);
}

TEST(Pickle, ValuesRoundTrip) {
  pickle::Builder b;
  const pickle::Value* v = b.dict({b.str("a"), b.tuple({b.integer(-5), b.integer(70000), b.integer(int64_t{1} << 40)}),
                                   b.str("f"), b.real(0.1), b.str("n"), b.none(), b.str("t"), b.boolean(true),
                                   b.str("l"), b.list({b.bytes("xy"), b.str("\xc3\xa9")})});
  for (int protocol : {2, 4}) {
    const pickle::Pickled p = pickle::read(pickle::write(*v, protocol), {}, "rt");
    const pickle::Value& d = *p.root;
    ASSERT_EQ(d.kind, Kind::kDict);
    EXPECT_EQ(d.get("a")->items[0]->i, -5);
    EXPECT_EQ(d.get("a")->items[1]->i, 70000);
    EXPECT_EQ(d.get("a")->items[2]->i, int64_t{1} << 40);
    EXPECT_EQ(d.get("f")->f, 0.1);
    EXPECT_EQ(d.get("n")->kind, Kind::kNone);
    EXPECT_TRUE(d.get("t")->b);
    EXPECT_EQ(d.get("l")->items[0]->s, "xy");
    EXPECT_EQ(d.get("l")->items[1]->s, "\xc3\xa9");
  }
}

TEST(Pickle, RefusesForeignClassesNamingThem) {
  // pickle.dumps(io.BytesIO(b"x")) as PyTorch's seed has it, and a GLOBAL of os.system.
  EXPECT_CONTAINS(testing::error_of<PickleError>([&] {
                    dcp::parse_metadata(seed("dcp_metadata", "foreign_class"), ".metadata");
                  }),
                  "_io.BytesIO");
  const std::string msg = pickle_error(std::string("\x80\x02") + "cos\nsystem\n" + "X\x02\x00\x00\x00ls\x85R.");
  EXPECT_CONTAINS(msg, "test.pkl");
  EXPECT_CONTAINS(msg, "os.system");
  EXPECT_CONTAINS(msg, "foreign class");
}

TEST(Pickle, RefusesHostileShapesWithoutCrashing) {
  // Deep nesting: 100 MARKs.
  EXPECT_CONTAINS(pickle_error("\x80\x02" + std::string(100, '(')), "deeper than");
  // A length far beyond the input.
  EXPECT_CONTAINS(pickle_error(std::string("\x80\x02X\xff\xff\xff\x7f", 7)), "left in the file");
  // A memo index beyond the limit.
  EXPECT_CONTAINS(pickle_error(std::string("\x80\x02Nr\xff\xff\xff\x7f.", 9)), "memo index");
  // Reading an unset memo entry.
  EXPECT_CONTAINS(pickle_error(std::string("\x80\x02h\x05.", 5)), "not set");
  // Truncated: no STOP.
  EXPECT_CONTAINS(pickle_error(std::string("\x80\x02]", 3)), "truncated");
  // Protocol 0 text opcodes and out-of-band buffers.
  EXPECT_CONTAINS(pickle_error("I1\n."), "not one this reader accepts");
  EXPECT_CONTAINS(pickle_error(std::string("\x80\x05\x97.", 4)), "out-of-band");
  // An integer wider than 64 bits.
  EXPECT_CONTAINS(pickle_error(std::string("\x80\x02\x8a\x09", 4) + std::string(9, '\x01') + "."), "64 bits");
  // Bytes after STOP.
  EXPECT_CONTAINS(pickle_error(std::string("\x80\x02N.junk", 8)), "after STOP");
}

TEST(Pickle, ACycleReadsAndIsRefusedWhenWalked) {
  // l = []; l.append(l): EMPTY_LIST, MEMOIZE (protocol 4), BINGET 0, APPEND, STOP.
  const std::string bytes("\x80\x04]\x94h\x00" "a.", 8);
  const pickle::Pickled p = pickle::read(bytes, {}, "cycle.pkl");
  ASSERT_EQ(p.root->kind, Kind::kList);
  EXPECT_EQ(p.root->items.at(0), p.root);  // the list holds itself; the arena frees it
  EXPECT_CONTAINS(testing::usage_error_of([&] { pickle::write(*p.root, 2); }), "nest deeper");
  // As DCP metadata it is refused, not walked forever.
  EXPECT_CONTAINS(testing::error_of<PickleError>([&] { dcp::parse_metadata(bytes, ".metadata"); }), ".metadata");
}

TEST(DcpItem, ReadsTorchSaveArchivesAndWritesThemBack) {
  for (const auto& [name, size] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"tensor_chunk", {4, 3}}, {"tensor_scalar", {}}}) {
    const std::string item = seed("dcp_item", name);
    const dcp::ReadAt read = [&](int64_t off, int64_t n, void* dst) {
      ASSERT_LE(off + n, static_cast<int64_t>(item.size()));
      std::memcpy(dst, item.data() + off, static_cast<size_t>(n));
    };
    const dcp::TensorRecord r = dcp::read_tensor_item(read, static_cast<int64_t>(item.size()), name);
    EXPECT_EQ(r.dtype, at::kFloat) << name;
    EXPECT_EQ(r.size, size) << name;
    EXPECT_EQ(r.data_offset % 64, 0) << name;  // PyTorchStreamWriter aligns records
  }
  // Ours: written, then read back with its values.
  const at::Tensor t = at::arange(12, at::kFloat).reshape({3, 4});
  std::string bytes;
  dcp::write_tensor_item(t, [&](const void* p, size_t n) { bytes.append(static_cast<const char*>(p), n); });
  const dcp::ReadAt read = [&](int64_t off, int64_t n, void* dst) { std::memcpy(dst, bytes.data() + off, n); };
  const dcp::TensorRecord r = dcp::read_tensor_item(read, static_cast<int64_t>(bytes.size()), "ours");
  EXPECT_EQ(r.size, (std::vector<int64_t>{3, 4}));
  const at::Tensor back = at::from_blob(bytes.data() + r.data_offset, {3, 4}, at::kFloat);
  EXPECT_TRUE(at::equal(back, t));
  // A non-tensor value.
  const std::string betas = seed("dcp_item", "value_tuple");
  const dcp::ReadAt rb = [&](int64_t off, int64_t n, void* dst) { std::memcpy(dst, betas.data() + off, n); };
  const dcp::PyValue v = dcp::read_value_item(rb, static_cast<int64_t>(betas.size()), "betas");
  ASSERT_EQ(v.kind, Kind::kTuple);
  ASSERT_EQ(v.items.size(), 2u);
  EXPECT_DOUBLE_EQ(v.items[0].f, 0.9);
}

// Finding 4: a 124-byte "billion laughs" reads as 121 values sharing each other, and is refused
// when a reader would copy it out as a tree, naming the file; a small shared graph still reads.
TEST(DcpItem, ASharedValueGraphIsRefusedBeforeItExpands) {
  const std::string laughs = shared_tuples(60);
  ASSERT_EQ(laughs.size(), 124u);
  EXPECT_NO_THROW(pickle::read(laughs, {}, "laughs.pkl"));  // 121 values: the graph itself is small
  const std::string item = archive_of(laughs);
  const std::string msg = testing::error_of<PickleError>([&] {
    dcp::read_value_item(reader_of(item), static_cast<int64_t>(item.size()), "fsdp_cpp.state");
  });
  EXPECT_CONTAINS(msg, "fsdp_cpp.state");
  EXPECT_CONTAINS(msg, "expand");
  // 2^4 leaves from 12 bytes: within the margin (Note [Materialized volume]), read as Python would.
  const std::string small = archive_of(shared_tuples(4));
  const dcp::PyValue v = dcp::read_value_item(reader_of(small), static_cast<int64_t>(small.size()), "small");
  ASSERT_EQ(v.kind, Kind::kTuple);
  EXPECT_EQ(v.items.size(), 2u);
}

// Finding 6: memo indices past the fixed 1,000,000 of earlier versions, as a large run's .metadata
// has them (PyTorch's pickler numbers every object it memoizes), read; an index no pickle of that
// size can reach is still refused.
TEST(Pickle, MemoGrowsWithTheInput) {
  constexpr int kEntries = 1'200'000;
  std::string pkl("\x80\x04]\x94(", 5);  // PROTO 4, EMPTY_LIST, MEMOIZE, MARK
  for (int i = 0; i < kEntries; ++i) {
    pkl += 'K';                                       // BININT1
    pkl += static_cast<char>(i & 0x7f);
    pkl += '\x94';                                    // MEMOIZE
  }
  pkl += "e";                                         // APPENDS
  pkl += "r";                                         // LONG_BINPUT at the last index, rebinding it
  const uint32_t last = kEntries;                     // the list is entry 0, the ints 1..kEntries
  pkl.append(reinterpret_cast<const char*>(&last), 4);
  pkl += "j";                                         // LONG_BINGET of it
  pkl.append(reinterpret_cast<const char*>(&last), 4);
  pkl += "0.";                                        // POP, STOP
  const pickle::Pickled p = pickle::read(pkl, {}, "large.pkl");
  ASSERT_EQ(p.root->kind, Kind::kList);
  EXPECT_EQ(p.root->items.size(), static_cast<size_t>(kEntries));
  EXPECT_EQ(p.root->items.back()->i, (kEntries - 1) & 0x7f);
  EXPECT_CONTAINS(pickle_error(std::string("\x80\x02Nr\x40\x00\x00\x00.", 9)), "memo index 64");
}

// Finding 21: sizes whose product overflows 64 bits (2^40 x 2^40) are refused before the strides
// multiply them (UBSan found the signed overflow), an empty tensor of such sizes included.
TEST(DcpItem, SizesThatOverflowAreRefusedBeforeTheStrideCheck) {
  for (const std::vector<int64_t>& size : std::vector<std::vector<int64_t>>{{int64_t{1} << 40, int64_t{1} << 40},
                                                                           {0, int64_t{1} << 40, int64_t{1} << 40}}) {
    pickle::Builder b;
    std::vector<const pickle::Value*> dims, strides;
    for (int64_t d : size) dims.push_back(b.integer(d));
    int64_t stride = 1;  // row-major: the strides the old check multiplied into an overflow
    for (size_t i = size.size(); i-- > 0;) {
      strides.insert(strides.begin(), b.integer(stride));
      stride = size[i] != 0 ? int64_t{1} << 40 : 1;
    }
    const pickle::Value* storage = b.persistent(
        b.tuple({b.str("storage"), b.global("torch", "FloatStorage"), b.str("0"), b.str("cpu"), b.integer(0)}));
    const pickle::Value* t = b.object(b.global("torch._utils", "_rebuild_tensor_v2"),
                                      b.tuple({storage, b.integer(0), b.tuple(dims), b.tuple(strides), b.boolean(false),
                                               b.none()}));
    const std::string item = archive_of(pickle::write(*t, 2));
    const std::string msg = testing::error_of<PickleError>([&] {
      dcp::read_tensor_item(reader_of(item), static_cast<int64_t>(item.size()), "huge item");
    });
    EXPECT_CONTAINS(msg, "huge item");
    if (size[0] != 0) EXPECT_CONTAINS(msg, "too large");  // the empty one fails later: it has no data record
  }
}

TEST(DcpItem, RefusesNonContiguousAndDamagedArchives) {
  const std::string strided = seed("dcp_item", "tensor_strided_bf16");
  const dcp::ReadAt read = [&](int64_t off, int64_t n, void* dst) { std::memcpy(dst, strided.data() + off, n); };
  EXPECT_CONTAINS(testing::error_of<PickleError>([&] {
                    dcp::read_tensor_item(read, static_cast<int64_t>(strided.size()), "strided item");
                  }),
                  "not contiguous");
  std::string cut = seed("dcp_item", "tensor_chunk");
  cut.resize(cut.size() / 2);
  const dcp::ReadAt rc = [&](int64_t off, int64_t n, void* dst) { std::memcpy(dst, cut.data() + off, n); };
  EXPECT_CONTAINS(testing::error_of<PickleError>([&] {
                    dcp::read_tensor_item(rc, static_cast<int64_t>(cut.size()), "cut item");
                  }),
                  "cut item");
}

}  // namespace fsdp::checkpoint
