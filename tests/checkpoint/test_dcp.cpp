// DCP directories written and read by every rank (checkpoint/dcp.h): exact
// round trips across world sizes for both chunk formats and both key layouts,
// each rank reading only its share, and hostile directories: a truncated data
// file, wrong offsets, a foreign class in .metadata, a chunk of another shape
// than the metadata says, a model of other shapes. (PyTorch itself reading and
// writing these directories: tests/peers/dcp_roundtrip.py.)
#include <nlohmann/json.hpp>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "ckpt_test_util.h"
#include "dcp_format.h"
#include "fsdp/checkpoint/dcp.h"
#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/common/error.h"
#include "fsdp/train/family_llama.h"
#include "support/errors.h"
#include "support/multiproc.h"

namespace fsdp {
namespace {

namespace fs = std::filesystem;
using testing::make_sharded_llama;
using testing::token_batch;

void train_steps(testing::ShardedLlama& m, int steps, int world, int rank) {
  for (int s = 0; s < steps; ++s) {
    const at::Tensor global = token_batch(6, 8, m.cfg.vocab_size, 300 + s);
    const int64_t rows = 6 / world;
    m.train_step(global.narrow(0, rank * rows, rows));
  }
}

void write_state(const std::string& path, const std::map<std::string, at::Tensor>& s) {
  std::vector<std::pair<std::string, at::Tensor>> v(s.begin(), s.end());
  checkpoint::save_safetensors(path, v);
}

std::map<std::string, at::Tensor> read_state(const std::string& path) {
  checkpoint::SafetensorsFile f(path);
  std::map<std::string, at::Tensor> out;
  for (const auto& e : f.entries()) out[e.name] = f.tensor(e.name);
  return out;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

checkpoint::DcpNames titan(const models::LlamaConfig& c) {
  return train::torchtitan_llama_names(c.num_attention_heads, c.num_key_value_heads);
}

}  // namespace

// Saved at 2 ranks, loaded at 1, 3 and 4: parameters, both moments and the
// step come back bit for bit, in each format and layout.
TEST(Dcp, RoundTripsAcrossWorldSizesFormatsAndLayouts) {
  struct Case {
    checkpoint::DcpFormat format;
    checkpoint::DcpLayout layout;
    const char* name;
  };
  for (const Case& c : {Case{checkpoint::DcpFormat::kTorchSave, checkpoint::DcpLayout::kTorch, "torch_save"},
                        Case{checkpoint::DcpFormat::kSafetensors, checkpoint::DcpLayout::kTorch, "safetensors"},
                        Case{checkpoint::DcpFormat::kTorchSave, checkpoint::DcpLayout::kTorchtitan, "torchtitan"}}) {
    const std::string dir = testing::temp_dir(std::string("dcp-") + c.name);
    testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
      auto m = make_sharded_llama(pg, "full");
      train_steps(m, 2, pg.size(), pg.rank());
      checkpoint::DcpSaveOptions so;
      so.format = c.format;
      so.layout = c.layout;
      if (c.layout == checkpoint::DcpLayout::kTorchtitan) so.names = titan(m.cfg);
      const auto io = checkpoint::save_dcp(dir + "/ckpt", *m.sharded, {m.opt.get()}, pg, so);
      EXPECT_GT(io.bytes, 0);
      const auto state = testing::full_state(m);
      if (pg.rank() == 0) write_state(dir + "/reference.safetensors", state);
    });
    if (c.format == checkpoint::DcpFormat::kTorchSave && !testing::is_worker()) {  // the parent looks
      EXPECT_TRUE(fs::exists(dir + "/ckpt/.metadata")) << c.name;
      EXPECT_TRUE(fs::exists(dir + "/ckpt/__0_0.distcp")) << c.name;
      EXPECT_TRUE(fs::exists(dir + "/ckpt/__1_0.distcp")) << c.name;
      const auto md = checkpoint::dcp::parse_metadata(slurp(dir + "/ckpt/.metadata"), ".metadata");
      const std::string q = c.layout == checkpoint::DcpLayout::kTorch ? "model.model.layers.0.self_attn.q_proj.weight"
                                                                      : "model.layers.0.attention.wq.weight";
      EXPECT_EQ(md.tensors.count(q), 1u) << c.name;
      EXPECT_EQ(md.tensors.count(c.layout == checkpoint::DcpLayout::kTorch
                                     ? "optimizer.state.model.norm.weight.exp_avg_sq"
                                     : "optimizer.state.norm.weight.exp_avg_sq"),
                1u)
          << c.name;
    }
    for (int world : {1, 3, 4}) {
      testing::run_distributed(world, [&](comm::ProcessGroup& pg) {
        auto m = make_sharded_llama(pg, "full", "block", /*seed=*/99);
        checkpoint::DcpLoadOptions lo;
        if (c.layout == checkpoint::DcpLayout::kTorchtitan) lo.names = titan(m.cfg);
        const auto r = checkpoint::load_dcp(dir + "/ckpt", *m.sharded, {m.opt.get()}, pg, lo);
        EXPECT_EQ(m.opt->step_count(), 2) << c.name;  // from fsdp_cpp.state
        if (c.format == checkpoint::DcpFormat::kTorchSave) EXPECT_EQ(r.optimizer_step, 2) << c.name;
        testing::expect_same_state(testing::full_state(m), read_state(dir + "/reference.safetensors"),
                                   std::string(c.name) + " at " + std::to_string(world));
        if (world > 1) {
          // Each rank reads about its share (items' directories and headers aside).
          int64_t total = 0;
          for (const auto& e : fs::directory_iterator(dir + "/ckpt")) total += static_cast<int64_t>(e.file_size());
          EXPECT_LT(r.io.bytes, total * 3 / 2) << c.name << " at " << world;
        }
        train_steps(m, 1, pg.size(), pg.rank());
      });
    }
  }
}

// Weights only (--init-from): the optimizer state stays as it was.
TEST(Dcp, LoadsWeightsOnly) {
  const std::string dir = testing::temp_dir("dcp-weights");
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    auto m = make_sharded_llama(pg, "full");
    train_steps(m, 1, pg.size(), pg.rank());
    checkpoint::save_dcp(dir + "/ckpt", *m.sharded, {m.opt.get()}, pg);
  });
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    auto m = make_sharded_llama(pg, "full", "block", 5);
    checkpoint::DcpLoadOptions lo;
    lo.load_optimizer = false;
    checkpoint::load_dcp(dir + "/ckpt", *m.sharded, {m.opt.get()}, pg, lo);
    EXPECT_EQ(m.opt->step_count(), 0);
    EXPECT_EQ(m.opt->slots()[0].exp_avg.abs().sum().item<double>(), 0.0);
  });
}

// Hostile directories: each a clear error naming the file, never a crash or a silent misread.
TEST(Dcp, HostileDirectoriesAreClearErrorsNamingTheFile) {
  const std::string dir = testing::temp_dir("dcp-hostile");
  const std::string ck = dir + "/ckpt";
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    auto m = make_sharded_llama(pg, "full");
    checkpoint::save_dcp(ck, *m.sharded, {m.opt.get()}, pg);
  });
  // Workers read these too, after the parent changed the files: only the parent's copy is used.
  const std::string metadata = slurp(ck + "/.metadata");
  const std::string data1 = slurp(ck + "/__1_0.distcp");
  auto load = [&](int world) {
    std::string msg;
    testing::run_distributed(world, [&](comm::ProcessGroup& pg) {
      auto m = make_sharded_llama(pg, "full");
      try {
        checkpoint::load_dcp(ck, *m.sharded, {m.opt.get()}, pg);
        ADD_FAILURE() << "loaded a damaged checkpoint";
      } catch (const checkpoint::DamagedCheckpoint& e) {
        if (pg.rank() == 0) spit(dir + "/message.txt", e.what());
      }
    });
    return testing::is_worker() ? std::string() : slurp(dir + "/message.txt");
  };
  // Files are changed by the parent only (workers run this code too: support/multiproc.h).
  const bool parent = !testing::is_worker();
  // A truncated data file.
  if (parent) spit(ck + "/__1_0.distcp", data1.substr(0, data1.size() / 2));
  std::string msg = load(2);
  if (parent) EXPECT_CONTAINS(msg, "__1_0.distcp");
  if (parent) EXPECT_CONTAINS(msg, "truncated");
  if (parent) spit(ck + "/__1_0.distcp", data1);
  // Wrong offsets: every item of rank 1's file moved by 7 bytes.
  {
    if (parent) {
      auto md = checkpoint::dcp::parse_metadata(metadata, ".metadata");
      for (auto& [k, s] : md.storage) {
        if (s.relative_path == "__1_0.distcp") s.offset += 7;
      }
      spit(ck + "/.metadata", checkpoint::dcp::write_metadata(md, ck, "id"));
    }
    msg = load(1);
    if (parent) EXPECT_CONTAINS(msg, "__1_0.distcp");
    if (parent) EXPECT_CONTAINS(msg, "not a torch.save archive");
  }
  // A chunk whose item holds another tensor than the metadata says (float32 saved, float64 claimed).
  {
    if (parent) {
      auto md = checkpoint::dcp::parse_metadata(metadata, ".metadata");
      md.tensors.at("model.model.norm.weight").dtype = at::kDouble;
      spit(ck + "/.metadata", checkpoint::dcp::write_metadata(md, ck, "id"));
    }
    msg = load(1);
    if (parent) EXPECT_CONTAINS(msg, ".distcp");
    if (parent) EXPECT_CONTAINS(msg, "model.model.norm.weight");
    if (parent) EXPECT_CONTAINS(msg, ".metadata says Double");
  }
  // A foreign class in the pickle.
  if (parent) {
    std::string bad = metadata;
    const std::string from = "torch.distributed.checkpoint.filesystem";
    const size_t at = bad.find(from);
    ASSERT_NE(at, std::string::npos);
    bad.replace(at, from.size(), std::string("subprocess").append(from.size() - 10, ' '));
    spit(ck + "/.metadata", bad);
  }
  {
    msg = load(1);
    if (parent) EXPECT_CONTAINS(msg, ".metadata");
    if (parent) EXPECT_CONTAINS(msg, "foreign class");
  }
  if (parent) spit(ck + "/.metadata", metadata);
  // A model of other shapes: a UsageError naming the parameter and both shapes.
  testing::run_distributed(1, [&](comm::ProcessGroup& pg) {
    models::LlamaConfig other = testing::small_config();
    other.intermediate_size = 64;
    auto m = make_sharded_llama(pg, "full", "block", 7, other);
    const std::string e =
        testing::usage_error_of([&] { checkpoint::load_dcp(ck, *m.sharded, {m.opt.get()}, pg); });
    EXPECT_CONTAINS(e, "gate_proj.weight");
    EXPECT_CONTAINS(e, "[72, 32]");
    EXPECT_CONTAINS(e, "[64, 32]");
  });
}

// Issue 50, finding 5: chunks that overlap and leave a gap hold as many elements as the tensor, so
// the metadata's count check passes; the load finds both (Note [Chunks cover once]) instead of
// loading the gap as zeros. Finding 16: NaN weights are damage naming the tensor and the file.
TEST(Dcp, ChunksMustCoverOnceAndWeightsBeFinite) {
  const std::string dir = testing::temp_dir("dcp-cover");
  const std::string ck = dir + "/ckpt";
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    auto m = make_sharded_llama(pg, "full");
    checkpoint::save_dcp(ck, *m.sharded, {m.opt.get()}, pg);
  });
  const bool parent = !testing::is_worker();
  const std::string metadata = slurp(ck + "/.metadata");
  std::string moved;
  if (parent) {
    auto md = checkpoint::dcp::parse_metadata(metadata, ".metadata");
    // A tensor in two chunks of whole rows: the second moved up a row.
    for (auto& [fqn, t] : md.tensors) {
      if (t.size.size() != 2 || t.chunks.size() != 2 || t.chunks[1].offsets[0] == 0) continue;
      if (t.chunks[0].sizes[1] != t.size[1] || t.chunks[1].sizes[1] != t.size[1]) continue;
      checkpoint::dcp::Chunk& second = t.chunks[1];
      const auto at = md.storage.find({fqn, true, second.offsets});
      ASSERT_NE(at, md.storage.end());
      const checkpoint::dcp::StorageInfo where = at->second;
      md.storage.erase(at);
      second.offsets[0] -= 1;
      md.storage[{fqn, true, second.offsets}] = where;
      moved = fqn;
      break;
    }
    ASSERT_FALSE(moved.empty()) << "no tensor saved in two chunks of rows";
    spit(ck + "/.metadata", checkpoint::dcp::write_metadata(md, ck, "id"));
    spit(dir + "/moved.txt", moved);
  }
  if (!parent) moved = slurp(dir + "/moved.txt");
  for (int world : {1, 2}) {
    testing::run_distributed(world, [&](comm::ProcessGroup& pg) {
      auto m = make_sharded_llama(pg, "full", "block", 3);
      const std::string msg = testing::error_of<checkpoint::DamagedCheckpoint>(
          [&] { checkpoint::load_dcp(ck, *m.sharded, {m.opt.get()}, pg); });
      EXPECT_CONTAINS(msg, moved);
      EXPECT_CONTAINS(msg, "exactly once");
    });
  }
  if (parent) spit(ck + "/.metadata", metadata);
  // NaN in a weight: saved as it is, refused on load, naming the tensor and its files.
  const std::string nan_ck = dir + "/nan";
  testing::run_distributed(1, [&](comm::ProcessGroup& pg) {
    auto m = make_sharded_llama(pg, "full");
    {
      at::NoGradGuard no_grad;
      m.sharded->shards().back().param.view(-1)[0] = std::numeric_limits<float>::quiet_NaN();
    }
    checkpoint::save_dcp(nan_ck, *m.sharded, {m.opt.get()}, pg);
    auto fresh = make_sharded_llama(pg, "full", "block", 3);
    checkpoint::DcpLoadOptions weights;
    weights.load_optimizer = false;
    const std::string msg = testing::error_of<checkpoint::DamagedCheckpoint>(
        [&] { checkpoint::load_dcp(nan_ck, *fresh.sharded, {}, pg, weights); });
    EXPECT_CONTAINS(msg, "NaN");
    EXPECT_CONTAINS(msg, "__0_0.distcp");
    EXPECT_CONTAINS(msg, "tensor 'model.");
  });
}

}  // namespace fsdp
