// The state seam (Note [State seam], common/state.h): the sharded checkpoint
// persists whatever StateOwners it is given. Here a non-Llama model (the MLP
// of the FSDP tutorial) and a non-AdamW optimizer (SGD with momentum) go
// through the same save_checkpoint / load_checkpoint as the trainer's Llama
// and AdamW: saved at 2 ranks, loaded at 1 and 3, every state tensor comes
// back bit for bit, the owners get their metadata back, and training goes on
// as an uninterrupted run. A checkpoint of one optimizer refuses another.
#include <nlohmann/json.hpp>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "fsdp/checkpoint/crc32c.h"
#include "fsdp/checkpoint/sharded.h"
#include "fsdp/common/error.h"
#include "fsdp/models/mlp.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/optim/sgd.h"
#include "support/errors.h"
#include "sharded_mlp.h"
#include "support/multiproc.h"

namespace fsdp {
namespace {

namespace fs = std::filesystem;

using testing::kMlp;
using testing::make_mlp;
using testing::ShardedMlp;

// Parameters and momentum buffers, gathered, by "kind/unit" (every rank gets it).
std::map<std::string, at::Tensor> full_state(ShardedMlp& m) {
  std::map<std::string, at::Tensor> out;
  const auto& units = m.sharded->units();
  const auto slots = m.opt->state_slots();
  for (size_t u = 0; u < units.size(); ++u) {
    const at::Tensor p = m.sharded->gather_unit(u);
    out["param/" + units[u].name] = p.narrow(0, 0, units[u].numel).clone();
    at::Tensor g = at::empty({units[u].padded_numel}, slots[u].value.options());
    m.sharded->shard_group()->all_gather(g, slots[u].value.contiguous())->wait();
    out["momentum_buffer/" + units[u].name] = g.narrow(0, 0, units[u].numel).clone();
  }
  return out;
}

}  // namespace

TEST(StateSeam, MlpWithSgdMomentumSavesAndResumesAtOtherWorldSizes) {
  const std::string dir = testing::temp_dir("seam");
  const std::string want_file = dir + "/expected.pt";
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    ShardedMlp m = make_mlp(pg, 3);
    for (int s = 0; s < 3; ++s) m.step(s, pg.size(), pg.rank());
    MetadataState trainer(checkpoint::kTrainerKey, {{"step", 3}});
    checkpoint::save_checkpoint(dir, 3, *m.sharded, {&m.model, &trainer, m.opt.get()}, pg);
    const auto state = full_state(m);
    std::vector<double> cont;
    for (int s = 3; s < 6; ++s) cont.push_back(m.step(s, pg.size(), pg.rank()));
    if (pg.rank() == 0) {
      std::vector<at::Tensor> flat;
      for (const auto& [k, t] : state) flat.push_back(t);
      flat.push_back(at::tensor(cont, at::kDouble));
      at::Tensor all = at::cat({at::cat(std::vector<at::Tensor>(flat.begin(), flat.end() - 1)).to(at::kDouble), flat.back()});
      std::ofstream out(want_file, std::ios::binary);
      out.write(static_cast<const char*>(all.data_ptr()), all.numel() * 8);
    }
    // The manifest names neither class: the owners' metadata and their slots' kinds.
    if (pg.rank() == 0) {
      std::ifstream in(dir + "/step_00000003/manifest.json");
      const auto j = nlohmann::json::parse(in);
      EXPECT_EQ(j["version"], 2);
      EXPECT_EQ(j["state"]["optimizer"]["type"], "SGD");
      EXPECT_EQ(j["state"]["model"]["family"], "mlp");
      std::set<std::string> kinds;
      for (const auto& f : j["files"]) {
        for (const auto& s : f["sections"]) kinds.insert(s["kind"].get<std::string>());
      }
      EXPECT_EQ(kinds, (std::set<std::string>{"param", "momentum_buffer"}));
    }
  });
  for (int world : {1, 3}) {
    testing::run_distributed(world, [&](comm::ProcessGroup& pg) {
      ShardedMlp m = make_mlp(pg, 11);  // other initial values
      MetadataState model(checkpoint::kModelKey, nullptr);
      MetadataState trainer(checkpoint::kTrainerKey, nullptr);
      const auto r = checkpoint::load_checkpoint(dir + "/step_00000003", *m.sharded, {&model, &trainer, m.opt.get()}, pg);
      EXPECT_EQ(r.step, 3);
      EXPECT_EQ(m.opt->step_count(), 3);
      EXPECT_EQ(model.loaded()["family"], "mlp");
      EXPECT_EQ(model.loaded()["config"]["width"], kMlp.width);
      EXPECT_EQ(trainer.loaded()["step"], 3);
      const auto state = full_state(m);
      std::vector<at::Tensor> flat;
      for (const auto& [k, t] : state) flat.push_back(t.to(at::kDouble));
      const at::Tensor got = at::cat(flat);
      std::ifstream in(want_file, std::ios::binary);
      std::vector<double> want(static_cast<size_t>(got.numel()) + 3);
      in.read(reinterpret_cast<char*>(want.data()), static_cast<std::streamsize>(want.size() * 8));
      ASSERT_TRUE(in.good()) << want_file;
      const at::Tensor w = at::from_blob(want.data(), {static_cast<int64_t>(want.size())}, at::kDouble);
      EXPECT_TRUE(at::equal(got, w.narrow(0, 0, got.numel()))) << "world " << world << ": the loaded state differs";
      for (int s = 3; s < 6; ++s) {
        const double loss = m.step(s, pg.size(), pg.rank());
        const double ref = want[static_cast<size_t>(got.numel() + s - 3)];
        // Another world size sums the gradient in another order: rounding only.
        EXPECT_NEAR(loss, ref, 1e-6 * std::abs(ref)) << "world " << world << " step " << s;
      }
    });
  }
  // The SGD checkpoint holds no AdamW state: refused, saying what is missing.
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    ShardedMlp m = make_mlp(pg, 3);
    optim::AdamW adamw(optim::AdamWOptions{});
    adamw.add_shards(m.sharded->shards());
    const std::string msg =
        testing::usage_error_of([&] { checkpoint::load_checkpoint(dir + "/step_00000003", *m.sharded, &adamw, pg); });
    EXPECT_CONTAINS(msg, "holds no exp_avg state");
  });
}

}  // namespace fsdp

namespace fsdp {

// A version-1 manifest (before the state seam: "model_config", "optimizer" and
// "trainer_state" at the top level, written by fsdp-cpp up to 9fc8542) loads
// as version 2: the same sections, its metadata handed to the owners.
TEST(StateSeam, Version1ManifestStillLoads) {
  const std::string dir = testing::temp_dir("seam-v1");
  const nlohmann::json config = {{"model_type", "llama"}, {"hidden_size", 13}};
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    ShardedMlp m = make_mlp(pg, 3);
    optim::AdamW adamw(optim::AdamWOptions{});
    adamw.add_shards(m.sharded->shards());
    for (int s = 0; s < 2; ++s) {
      m.step(s, pg.size(), pg.rank());  // SGD moves the weights; AdamW's state moves too
      adamw.step();
    }
    checkpoint::save_checkpoint(dir, 2, *m.sharded, &adamw, config, {{"step", 2}}, pg);
    if (pg.rank() != 0) return;
    // Rewrite the manifest as version 1 laid it out, with its checksum.
    const std::string path = dir + "/step_00000002/manifest.json";
    nlohmann::json j = nlohmann::json::parse(std::ifstream(path));
    j["version"] = 1;
    j["model_config"] = j["state"]["model"]["config"];
    j["optimizer"] = j["state"]["optimizer"];
    j["trainer_state"] = j["state"]["trainer"];
    j.erase("state");
    const std::string text = j.dump(1) + "\n";
    std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
    char crc[16];
    std::snprintf(crc, sizeof(crc), "%08x\n", checkpoint::crc32c(text.data(), text.size()));
    std::ofstream(dir + "/step_00000002/manifest.crc32c", std::ios::binary | std::ios::trunc) << crc;
  });
  testing::run_distributed(3, [&](comm::ProcessGroup& pg) {
    ShardedMlp m = make_mlp(pg, 11);
    optim::AdamW adamw(optim::AdamWOptions{});
    adamw.add_shards(m.sharded->shards());
    MetadataState model(checkpoint::kModelKey, nullptr);
    MetadataState trainer(checkpoint::kTrainerKey, nullptr);
    const auto r = checkpoint::load_checkpoint(dir + "/step_00000002", *m.sharded, {&model, &trainer, &adamw}, pg);
    EXPECT_EQ(r.step, 2);
    EXPECT_EQ(adamw.step_count(), 2);
    EXPECT_EQ(model.loaded(), (nlohmann::json{{"family", "llama"}, {"config", config}}));
    EXPECT_EQ(trainer.loaded(), (nlohmann::json{{"step", 2}}));
    EXPECT_EQ(*r.trainer_state, (nlohmann::json{{"step", 2}}));
    double moments = 0;
    for (const auto& slot : adamw.slots()) moments += slot.exp_avg_sq.abs().sum().item<double>();
    EXPECT_GT(moments, 0.0);  // the moments came back
  });
}

}  // namespace fsdp
