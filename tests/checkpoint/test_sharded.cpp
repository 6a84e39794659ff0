// Sharded checkpoints: exact round trips, re-cutting for other world sizes,
// strategies and wrap policies, damaged files, keep-last, stale temporaries.
#include <nlohmann/json.hpp>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include <unistd.h>

#include "ckpt_test_util.h"
#include "fsdp/checkpoint/ownership.h"
#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/checkpoint/sharded.h"
#include "fsdp/common/error.h"
#include "support/errors.h"
#include "support/multiproc.h"

namespace fsdp {
namespace {

namespace fs = std::filesystem;
using testing::make_sharded_llama;
using testing::token_batch;

const nlohmann::json kTrainerState = {{"step", 3}, {"seed", 7}};

void train(testing::ShardedLlama& m, int steps, int world, int rank) {
  // Every rank takes its slice of a fixed global batch of 4 rows.
  for (int s = 0; s < steps; ++s) {
    const at::Tensor global = token_batch(4, 16, m.cfg.vocab_size, 100 + s);
    const int64_t rows = 4 / world;
    m.train_step(global.narrow(0, rank * rows, rows));
  }
}

std::map<std::string, at::Tensor> read_state(const std::string& path) {
  checkpoint::SafetensorsFile f(path);
  std::map<std::string, at::Tensor> out;
  for (const auto& e : f.entries()) out[e.name] = f.tensor(e.name);
  return out;
}

void write_state(const std::string& path, const std::map<std::string, at::Tensor>& s) {
  std::vector<std::pair<std::string, at::Tensor>> v(s.begin(), s.end());
  checkpoint::save_safetensors(path, v);
}

// A checkpoint in `ckpt` and, beside it in `ckpt`.safetensors, the full state
// it holds (collective).
void save_with_state(testing::ShardedLlama& m, const std::string& ckpt, int64_t step, comm::ProcessGroup& pg) {
  checkpoint::save_checkpoint(ckpt, step, *m.sharded, m.opt.get(), {}, {}, pg);
  const auto state = testing::full_state(m);
  if (pg.rank() == 0) write_state(ckpt + ".safetensors", state);
}

void write_notes(const std::string& dir) {
  fs::create_directories(dir);
  std::ofstream(dir + "/notes.txt") << "notes";
}

void flip_byte(const std::string& path, int64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  char c;
  f.get(c);
  f.seekp(offset);
  f.put(static_cast<char>(c ^ 0x10));
}

}  // namespace

// Saved on 4 ranks (FULL_SHARD, one unit per block); loaded on 1, 2 and 4
// ranks with other strategies and wrap policies: the full state (parameters
// and both moments) comes back bit for bit, and training continues.
TEST(ShardedCheckpoint, RecutsForOtherWorldSizesStrategiesAndWraps) {
  const std::string dir = testing::temp_dir("ckpt-recut");
  testing::run_distributed(4, [&](comm::ProcessGroup& pg) {
    auto m = make_sharded_llama(pg, "full");
    train(m, 3, pg.size(), pg.rank());
    checkpoint::SaveOptions so;
    so.block_size = 256;  // small blocks: loads read only part of each file
    auto r = checkpoint::save_checkpoint(dir + "/ckpt", 3, *m.sharded, m.opt.get(), nlohmann::json::parse(m.cfg.to_hf_config_json()),
                                         kTrainerState, pg, so);
    EXPECT_EQ(r.path, dir + "/ckpt/step_00000003");
    EXPECT_GT(r.io.bytes, 0);
    const auto state = testing::full_state(m);
    if (pg.rank() == 0) write_state(dir + "/reference.safetensors", state);
  });
  struct Case {
    int world;
    std::string strategy, wrap;
  };
  for (const Case& c : {Case{1, "full", "block"}, Case{2, "full", "root"}, Case{2, "none", "block"},
                        Case{4, "hybrid", "block"}, Case{4, "grad-op", "root"}}) {
    testing::run_distributed(c.world, [&](comm::ProcessGroup& pg) {
      auto m = make_sharded_llama(pg, c.strategy, c.wrap, /*seed=*/99);  // other initial values
      auto r = checkpoint::load_checkpoint(dir + "/ckpt/step_00000003", *m.sharded, m.opt.get(), pg);
      EXPECT_TRUE(r.loaded);
      EXPECT_EQ(r.step, 3);
      EXPECT_EQ(*r.trainer_state, kTrainerState);
      EXPECT_EQ(m.opt->step_count(), 3);
      EXPECT_EQ((*r.manifest)["world_size"], 4);
      EXPECT_EQ((*r.manifest)["shard_group_size"], 4);
      const std::string what = std::to_string(c.world) + " " + c.strategy + " " + c.wrap;
      testing::expect_same_state(testing::full_state(m), read_state(dir + "/reference.safetensors"), what);
      if (c.world > 1) {
        // Each rank read about its share, not whole files (256-byte checksum blocks).
        const int64_t total = fs::file_size(dir + "/ckpt/step_00000003/shard-00000-of-00004.bin") * 4;
        const double share = c.strategy == "hybrid" || c.strategy == "none" ? 2.0 : 1.0;  // replicas read the same
        EXPECT_LT(r.io.bytes, static_cast<int64_t>(total * share * 1.25)) << what;
      }
      train(m, 1, pg.size(), pg.rank());  // the loaded state trains
    });
  }
}

// HYBRID: replicas hold identical shards, so only the first shard group writes.
// Exactness at the same layout: every state tensor bit for bit, and the next
// steps' losses equal an uninterrupted run's.
TEST(ShardedCheckpoint, HybridWritesOneReplicaAndResumesExactly) {
  const std::string dir = testing::temp_dir("ckpt-hybrid");
  testing::run_distributed(4, [&](comm::ProcessGroup& pg) {
    auto m = make_sharded_llama(pg, "hybrid");
    train(m, 2, pg.size(), pg.rank());
    checkpoint::save_checkpoint(dir, 2, *m.sharded, m.opt.get(), {}, {{"step", 2}}, pg);
    std::vector<double> cont;
    for (int s = 2; s < 4; ++s) {
      const at::Tensor global = token_batch(4, 16, m.cfg.vocab_size, 100 + s);
      cont.push_back(m.train_step(global.narrow(0, pg.rank(), 1)));
    }
    auto fresh = make_sharded_llama(pg, "hybrid", "block", 5);
    checkpoint::load_checkpoint(dir + "/step_00000002", *fresh.sharded, fresh.opt.get(), pg);
    for (int s = 2; s < 4; ++s) {
      const at::Tensor global = token_batch(4, 16, m.cfg.vocab_size, 100 + s);
      EXPECT_EQ(fresh.train_step(global.narrow(0, pg.rank(), 1)), cont[static_cast<size_t>(s - 2)]) << s;
    }
  });
  if (testing::is_worker()) return;
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir + "/step_00000002")) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{".fsdp-cpp-owned", "manifest.crc32c", "manifest.json",
                                             "shard-00000-of-00002.bin", "shard-00001-of-00002.bin"}));
  std::ifstream in(dir + "/step_00000002/manifest.json");
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["strategy"], "HYBRID_SHARD");
  EXPECT_EQ(j["replicate_group_size"], 2);
  EXPECT_EQ(j["files"].size(), 2u);
  EXPECT_EQ(j["checksum"]["algorithm"], "crc32c");
  for (const auto& f : j["files"]) {
    EXPECT_EQ(f["size"].get<int64_t>(), static_cast<int64_t>(fs::file_size(dir + "/step_00000002/" + f["name"].get<std::string>())));
    EXPECT_EQ(f["sections"].size(), 3u * j["units"].size());  // param, exp_avg, exp_avg_sq per unit
  }
}

// A flipped byte or a truncated file in the newest checkpoint is reported by
// file name and the previous good checkpoint is loaded instead.
TEST(ShardedCheckpoint, DamagedNewestFallsBackToThePreviousGoodOne) {
  const std::string dir = testing::temp_dir("ckpt-damage");
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    auto m = make_sharded_llama(pg, "full");
    std::map<std::string, at::Tensor> at1;
    for (int s = 1; s <= 3; ++s) {
      train(m, 1, pg.size(), pg.rank());
      checkpoint::save_checkpoint(dir, s, *m.sharded, m.opt.get(), {}, {{"step", s}}, pg);
      if (s == 1) at1 = testing::full_state(m);
    }
    pg.barrier(std::chrono::seconds(30));
    if (pg.rank() == 0) {
      flip_byte(dir + "/step_00000003/shard-00001-of-00002.bin", 100);
      fs::resize_file(dir + "/step_00000002/shard-00000-of-00002.bin", 1000);
    }
    pg.barrier(std::chrono::seconds(30));
    auto fresh = make_sharded_llama(pg, "full", "block", 11);
    auto r = checkpoint::load_latest_checkpoint(dir, *fresh.sharded, fresh.opt.get(), pg);
    EXPECT_TRUE(r.loaded);
    EXPECT_EQ(r.step, 1);
    ASSERT_EQ(r.rejected.size(), 2u);
    EXPECT_NE(r.rejected[0].find("step_00000003"), std::string::npos) << r.rejected[0];
    EXPECT_NE(r.rejected[0].find("shard-00001-of-00002.bin"), std::string::npos) << r.rejected[0];
    EXPECT_NE(r.rejected[0].find("checksum mismatch"), std::string::npos) << r.rejected[0];
    EXPECT_NE(r.rejected[1].find("shard-00000-of-00002.bin"), std::string::npos) << r.rejected[1];
    EXPECT_NE(r.rejected[1].find("truncated"), std::string::npos) << r.rejected[1];
    testing::expect_same_state(testing::full_state(fresh), at1, "fallback to step 1");
    EXPECT_EQ(fresh.opt->step_count(), 1);

    // A damaged manifest is damage too; when nothing is left, a Failure says so.
    pg.barrier(std::chrono::seconds(30));
    if (pg.rank() == 0) {
      std::ofstream(dir + "/step_00000001/manifest.json", std::ios::app) << " ";
    }
    pg.barrier(std::chrono::seconds(30));
    try {
      checkpoint::load_latest_checkpoint(dir, *fresh.sharded, fresh.opt.get(), pg);
      ADD_FAILURE() << "expected a Failure";
    } catch (const Failure& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("every checkpoint"), std::string::npos) << msg;
      EXPECT_NE(msg.find("manifest.json"), std::string::npos) << msg;
    }
  });
}

// keep_last prunes older complete checkpoints after the new one is complete;
// stale temporaries are removed, complete checkpoints never; a directory
// without a manifest is not a checkpoint.
TEST(ShardedCheckpoint, KeepLastAndStaleTemporaries) {
  const std::string dir = testing::temp_dir("ckpt-keep");
  testing::run_distributed(1, [&](comm::ProcessGroup& pg) {
    auto m = make_sharded_llama(pg, "full");
    checkpoint::SaveOptions so;
    so.keep_last = 2;
    std::vector<std::string> pruned;
    for (int s = 1; s <= 4; ++s) {
      auto r = checkpoint::save_checkpoint(dir, s * 10, *m.sharded, m.opt.get(), {}, {}, pg, so);
      pruned.insert(pruned.end(), r.pruned.begin(), r.pruned.end());
    }
    EXPECT_EQ(pruned, (std::vector<std::string>{"step_00000010", "step_00000020"}));
    const auto list = checkpoint::list_checkpoints(dir);
    ASSERT_EQ(list.size(), 2u);
    EXPECT_EQ(list[0].step, 40);
    EXPECT_EQ(list[1].step, 30);

    // What a crashed save leaves: a temporary directory (ours: it has the
    // marker) with a partial file.
    fs::create_directories(dir + "/.tmp-step_00000050");
    std::ofstream(dir + "/.tmp-step_00000050/" + checkpoint::kOwnedMarker) << "ours";
    std::ofstream(dir + "/.tmp-step_00000050/shard-00000-of-00001.bin") << "partial";
    fs::create_directories(dir + "/step_00000060");  // no manifest: not a checkpoint, and said so
    std::vector<std::string> ignored;
    EXPECT_EQ(checkpoint::list_checkpoints(dir, &ignored).size(), 2u);
    EXPECT_EQ(ignored, std::vector<std::string>{"step_00000060 (no manifest.json)"});
    fs::remove(dir + "/step_00000060");
    auto fresh = make_sharded_llama(pg, "full", "block", 3);
    EXPECT_EQ(checkpoint::load_latest_checkpoint(dir, *fresh.sharded, fresh.opt.get(), pg).step, 40);
    EXPECT_EQ(checkpoint::remove_stale_temporaries(dir), std::vector<std::string>{".tmp-step_00000050"});
    EXPECT_TRUE(fs::exists(dir + "/step_00000030/manifest.json"));
    EXPECT_TRUE(fs::exists(dir + "/step_00000040/manifest.json"));
    // Saving a step that exists again replaces it whole.
    checkpoint::save_checkpoint(dir, 40, *m.sharded, m.opt.get(), {}, {{"again", true}}, pg, so);
    EXPECT_EQ((*checkpoint::load_checkpoint(dir + "/step_00000040", *fresh.sharded, fresh.opt.get(), pg)
                    .trainer_state)["again"], true);
    EXPECT_FALSE(fs::exists(dir + "/.old-step_00000040"));
    // Checkpoints newer than the one saved (left by a run this one fell back
    // from) are never pruned; older ones are, down to keep_last.
    so.keep_last = 1;
    EXPECT_TRUE(checkpoint::save_checkpoint(dir, 25, *m.sharded, m.opt.get(), {}, {}, pg, so).pruned.empty());
    EXPECT_EQ(checkpoint::save_checkpoint(dir, 35, *m.sharded, m.opt.get(), {}, {}, pg, so).pruned,
              (std::vector<std::string>{"step_00000030", "step_00000025"}));
    EXPECT_TRUE(fs::exists(dir + "/step_00000040/manifest.json"));
  });
}

// Pure-bf16 training (bf16 master shards, AnyPrecision AdamW with bf16 moments
// and a Kahan compensation buffer): every state tensor round-trips bit for bit
// at another world size, and the same checkpoint loads into an fp32 model
// (converted) whose optimizer has no compensation buffer.
TEST(ShardedCheckpoint, Bf16MasterWeightsAndKahanState) {
  const std::string dir = testing::temp_dir("ckpt-bf16");
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    auto m = make_sharded_llama(pg, "full", "block", 7, testing::small_config(), "bf16-pure");
    train(m, 2, pg.size(), pg.rank());
    ASSERT_EQ(m.sharded->shards()[1].param.scalar_type(), at::kBFloat16);
    ASSERT_TRUE(m.opt->slots()[1].compensation.defined());
    checkpoint::save_checkpoint(dir, 2, *m.sharded, m.opt.get(), {}, {}, pg);
    int64_t nonzero = 0;
    for (auto& slot : m.opt->slots()) nonzero += slot.compensation.ne(0).sum().item<int64_t>();
    EXPECT_GT(nonzero, 0) << "the test needs a non-zero compensation buffer";
    const auto state = testing::full_state(m);
    if (pg.rank() == 0) {
      std::map<std::string, at::Tensor> as_f32;
      for (const auto& [k, t] : state) as_f32[k] = t.to(at::kFloat);
      write_state(dir + "/reference.safetensors", as_f32);
    }
  });
  testing::run_distributed(1, [&](comm::ProcessGroup& pg) {
    auto m = make_sharded_llama(pg, "full", "root", 3, testing::small_config(), "bf16-pure");
    checkpoint::load_checkpoint(dir + "/step_00000002", *m.sharded, m.opt.get(), pg);
    std::map<std::string, at::Tensor> as_f32;
    for (const auto& [k, t] : testing::full_state(m)) as_f32[k] = t.to(at::kFloat);
    testing::expect_same_state(as_f32, read_state(dir + "/reference.safetensors"), "bf16 at world 1");

    auto f = make_sharded_llama(pg, "full", "block", 3);  // fp32 master weights, plain AdamW
    checkpoint::load_checkpoint(dir + "/step_00000002", *f.sharded, f.opt.get(), pg);
    auto reference = read_state(dir + "/reference.safetensors");
    for (auto it = reference.begin(); it != reference.end();) {
      it = it->first.rfind("compensation/", 0) == 0 ? reference.erase(it) : std::next(it);
    }
    testing::expect_same_state(testing::full_state(f), reference, "bf16 into fp32");
  });
}

// Frozen shards hold the param dtype (Note [Frozen shards in the param dtype]):
// bf16 under --mixed-precision bf16, fp32 without. A resume under the other
// precision converts them: fp32 -> bf16 rounds each frozen value once, which
// is what the fp32 run's all-gather computed with under bf16; bf16 -> fp32
// widens exactly (the fp32 values were never in the bf16 run). Trainable
// masters and both moments are fp32 either way and come back bit for bit, and
// the resumed runs train.
TEST(ShardedCheckpoint, FrozenShardsConvertWhenThePrecisionChanges) {
  const std::string dir = testing::temp_dir("ckpt-frozen");
  const std::string freeze = "self_attn|embed_tokens";  // the MLPs, norms and head train
  const std::regex frozen(freeze);
  auto is_frozen = [&](const std::string& key) {  // "param/<name>"
    return key.rfind("param/", 0) == 0 && std::regex_search(key.substr(6), frozen);
  };
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    auto m = make_sharded_llama(pg, "full", "block", 7, testing::small_config(), "fp32", freeze);
    train(m, 2, pg.size(), pg.rank());
    save_with_state(m, dir + "/fp32", 2, pg);
  });
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    auto m = make_sharded_llama(pg, "full", "block", 3, testing::small_config(), "bf16", freeze);
    int64_t frozen_entries = 0;
    for (const auto& s : m.sharded->shards()) {
      if (s.trainable) continue;
      EXPECT_EQ(s.param.scalar_type(), at::kBFloat16);
      ++frozen_entries;
    }
    EXPECT_GT(frozen_entries, 0);
    checkpoint::load_checkpoint(dir + "/fp32/step_00000002", *m.sharded, m.opt.get(), pg);
    auto expected = read_state(dir + "/fp32.safetensors");
    int64_t rounded = 0;
    for (auto& [k, t] : expected) {
      if (!is_frozen(k)) continue;
      const at::Tensor r = t.to(at::kBFloat16);
      rounded += r.to(at::kFloat).ne(t).sum().item<int64_t>();
      t = r;
    }
    EXPECT_GT(rounded, 0) << "the test needs frozen values that bf16 cannot hold";
    testing::expect_same_state(testing::full_state(m), expected, "fp32 into bf16");
    train(m, 1, pg.size(), pg.rank());
    save_with_state(m, dir + "/bf16", 3, pg);
  });
  testing::run_distributed(1, [&](comm::ProcessGroup& pg) {
    auto m = make_sharded_llama(pg, "full", "block", 5, testing::small_config(), "fp32", freeze);
    checkpoint::load_checkpoint(dir + "/bf16/step_00000003", *m.sharded, m.opt.get(), pg);
    auto expected = read_state(dir + "/bf16.safetensors");
    for (auto& [k, t] : expected) {
      EXPECT_EQ(t.scalar_type(), is_frozen(k) ? at::kBFloat16 : at::kFloat) << k;
      t = t.to(at::kFloat);
    }
    testing::expect_same_state(testing::full_state(m), expected, "bf16 into fp32");
    train(m, 1, pg.size(), pg.rank());
  });
}

// Resuming with another --freeze: freezing more drops optimizer state the run
// does not use, and the rest comes back bit for bit; training a parameter that
// was frozen at the save is refused (its moments were never kept, and zeros
// under the saved step count would make its first updates far too large).
TEST(ShardedCheckpoint, ResumeMayFreezeMoreButNotTrainWhatWasFrozen) {
  const std::string dir = testing::temp_dir("ckpt-refreeze");
  const std::string freeze = "self_attn";
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    auto m = make_sharded_llama(pg, "full", "block", 7, testing::small_config(), "fp32", freeze);
    train(m, 2, pg.size(), pg.rank());
    save_with_state(m, dir + "/ckpt", 2, pg);
  });
  testing::run_distributed(1, [&](comm::ProcessGroup& pg) {
    auto more = make_sharded_llama(pg, "full", "block", 3, testing::small_config(), "fp32", freeze + "|mlp");
    checkpoint::load_checkpoint(dir + "/ckpt/step_00000002", *more.sharded, more.opt.get(), pg);
    auto expected = read_state(dir + "/ckpt.safetensors");
    for (auto it = expected.begin(); it != expected.end();) {  // the MLPs' moments are not kept now
      const bool mlp_moment = it->first.rfind("param/", 0) != 0 && it->first.find(".mlp.") != std::string::npos;
      it = mlp_moment ? expected.erase(it) : std::next(it);
    }
    testing::expect_same_state(testing::full_state(more), expected, "frozen more");
    train(more, 1, pg.size(), pg.rank());

    auto fewer = make_sharded_llama(pg, "full", "block", 3, testing::small_config(), "fp32", "k_proj");
    try {
      checkpoint::load_checkpoint(dir + "/ckpt/step_00000002", *fewer.sharded, fewer.opt.get(), pg);
      ADD_FAILURE() << "expected a UsageError";
    } catch (const UsageError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("'model.layers.0.self_attn.q_proj.weight' frozen"), std::string::npos) << msg;
      EXPECT_NE(msg.find("freeze_matching: pattern"), std::string::npos) << msg;
    }
  });
}

// A checkpoint of another model is a usage error naming the parameter and both shapes.
TEST(ShardedCheckpoint, AnotherModelIsAUsageError) {
  const std::string dir = testing::temp_dir("ckpt-other");
  testing::run_distributed(1, [&](comm::ProcessGroup& pg) {
    auto m = make_sharded_llama(pg, "full");
    checkpoint::save_checkpoint(dir, 1, *m.sharded, m.opt.get(), {}, {}, pg);
    auto cfg = testing::small_config();
    cfg.intermediate_size = 80;
    auto other = make_sharded_llama(pg, "full", "block", 7, cfg);
    try {
      checkpoint::load_latest_checkpoint(dir, *other.sharded, other.opt.get(), pg);
      ADD_FAILURE() << "expected a UsageError";
    } catch (const UsageError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("model.layers.0.mlp.gate_proj.weight"), std::string::npos) << msg;
      EXPECT_NE(msg.find("[72, 32]"), std::string::npos) << msg;
      EXPECT_NE(msg.find("[80, 32]"), std::string::npos) << msg;
    }
  });
}

// Issue 16, finding 1: a step_N directory without a manifest, and .tmp-/.old-/
// .del- directories without our marker, are never overwritten or deleted:
// saving, pruning and start-up cleaning refuse with a UsageError naming them,
// and every file in them survives.
TEST(ShardedCheckpoint, NeverDeletesWhatItDidNotCreate) {
  const std::string dir = testing::temp_dir("ckpt-foreign");
  testing::run_distributed(1, [&](comm::ProcessGroup& pg) {
    auto m = make_sharded_llama(pg, "full");
    auto save = [&](int64_t step, int keep_last = 0) {
      checkpoint::SaveOptions so;
      so.keep_last = keep_last;
      checkpoint::save_checkpoint(dir, step, *m.sharded, m.opt.get(), {}, {}, pg, so);
    };
    // A user's step_00000002 (no manifest): a save of step 2 refuses to replace it.
    write_notes(dir + "/step_00000002");
    EXPECT_CONTAINS(testing::usage_error_of([&] { save(2); }), dir + "/step_00000002: it exists and is not a checkpoint");
    EXPECT_CONTAINS(testing::usage_error_of([&] { checkpoint::check_checkpoint_dir(dir); }),
                    "holds step_00000002 (no manifest.json): named like a checkpoint but not one");
    EXPECT_TRUE(fs::exists(dir + "/step_00000002/notes.txt"));
    fs::remove_all(dir + "/step_00000002");

    // Temporary names that hold someone else's files.
    save(1);
    write_notes(dir + "/.tmp-step_00000003");
    EXPECT_CONTAINS(testing::usage_error_of([&] { save(3); }),
                    dir + "/.tmp-step_00000003 exists but was not created by fsdp-cpp");
    write_notes(dir + "/.old-step_00000001");
    EXPECT_CONTAINS(testing::usage_error_of([&] { save(1); }), dir + "/.old-step_00000001 exists but was not created");
    EXPECT_TRUE(fs::exists(dir + "/step_00000001/manifest.json"));  // the checkpoint is untouched too
    write_notes(dir + "/.del-step_00000001");
    EXPECT_CONTAINS(testing::usage_error_of([&] { save(4, /*keep_last=*/1); }),
                    dir + "/.del-step_00000001 exists but was not created");
    EXPECT_TRUE(fs::exists(dir + "/step_00000001/manifest.json"));
    // Start-up cleaning: all or nothing, so our own leftover stays too.
    fs::create_directories(dir + "/.tmp-step_00000009");
    std::ofstream(dir + "/.tmp-step_00000009/" + checkpoint::kOwnedMarker) << "ours";
    EXPECT_CONTAINS(testing::usage_error_of([&] { checkpoint::remove_stale_temporaries(dir); }),
                    "move or delete " + dir + "/.del-step_00000001 by hand");
    EXPECT_TRUE(fs::exists(dir + "/.tmp-step_00000009"));
    for (const char* d : {".tmp-step_00000003", ".old-step_00000001", ".del-step_00000001"}) {
      EXPECT_TRUE(fs::exists(dir + "/" + d + "/notes.txt")) << d;
      fs::remove_all(dir + "/" + d);
    }
    // Once they are gone, everything works: our leftover is removed, keep_last prunes.
    // An empty one without the marker (a crash right after creating it) goes too: it holds nothing.
    fs::create_directories(dir + "/.tmp-step_00000010");
    EXPECT_EQ(checkpoint::remove_stale_temporaries(dir),
              (std::vector<std::string>{".tmp-step_00000009", ".tmp-step_00000010"}));
    save(3);
    save(4, /*keep_last=*/1);
    const auto list = checkpoint::list_checkpoints(dir);
    ASSERT_EQ(list.size(), 1u);
    EXPECT_EQ(list[0].step, 4);
  });
}

// One run at a time writes a --checkpoint-dir: while another process holds
// its lock, open_checkpoint_dir refuses on every rank (a UsageError naming the
// holder's pid); once released, it locks (rank 0 holds the lock).
TEST(ShardedCheckpoint, ALockedDirectoryIsRefusedOnEveryRank) {
  const std::string dir = testing::temp_dir("ckpt-lock");
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    fs::create_directories(dir);
    // Rank 1 plays the other run (flock locks conflict between open files, even in one process).
    std::unique_ptr<checkpoint::DirectoryLock> other;
    if (pg.rank() == 1) other = std::make_unique<checkpoint::DirectoryLock>(dir + "/.lock", "the other run");
    const std::vector<std::string> pids = checkpoint::all_gather_strings(pg, std::to_string(::getpid()));
    EXPECT_CONTAINS(testing::usage_error_of([&] { checkpoint::open_checkpoint_dir(dir, pg); }),
                    "open_checkpoint_dir: dir " + dir + " is in use by another fsdp-cpp process (pid " + pids[1] +
                        " on host");
    other.reset();
    checkpoint::all_gather_strings(pg, "");
    {
      const checkpoint::CheckpointDirHold hold = checkpoint::open_checkpoint_dir(dir, pg);
      EXPECT_EQ(hold.lock != nullptr, pg.rank() == 0);
      EXPECT_TRUE(fs::exists(dir + "/.lock"));
      checkpoint::all_gather_strings(pg, "");
    }
    checkpoint::all_gather_strings(pg, "");
    EXPECT_FALSE(fs::exists(dir + "/.lock"));  // removed on release
  });
}

// Issue 50, finding 2: a checkpoint linked into --checkpoint-dir from elsewhere (a base to resume
// from) is pruned by keep_last as a link, and saved over as a link: what it names stays byte for
// byte, no marker is written into it. A file inside a checkpoint that is a link is damage: a
// checkpoint from elsewhere must not name a file of this machine.
TEST(ShardedCheckpoint, LinksInTheDirectoryAreNeverFollowed) {
  const std::string root = testing::temp_dir("ckpt-links");
  const std::string other = root + "/other", dir = root + "/ck";
  testing::run_distributed(1, [&](comm::ProcessGroup& pg) {
    auto m = make_sharded_llama(pg, "full");
    checkpoint::save_checkpoint(other, 10, *m.sharded, m.opt.get(), {}, {}, pg);
    auto files_of = [](const std::string& d) {
      std::map<std::string, std::string> out;
      for (const auto& e : fs::recursive_directory_iterator(d)) {
        if (!e.is_regular_file()) continue;
        std::ifstream in(e.path(), std::ios::binary);
        out[fs::relative(e.path(), d).string()] =
            std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      }
      return out;
    };
    const auto before = files_of(other);
    fs::create_directories(dir);
    fs::create_directory_symlink(other + "/step_00000010", dir + "/step_00000010");
    // Saved again at the link's own step: the link is replaced by the new checkpoint.
    checkpoint::save_checkpoint(dir, 10, *m.sharded, m.opt.get(), {}, {{"again", true}}, pg);
    EXPECT_FALSE(fs::is_symlink(dir + "/step_00000010"));
    EXPECT_EQ(files_of(other), before);
    // Linked in again under another step, then pruned: the link goes, the checkpoint stays.
    fs::create_directory_symlink(other + "/step_00000010", dir + "/step_00000005");
    checkpoint::SaveOptions so;
    so.keep_last = 1;
    const auto r = checkpoint::save_checkpoint(dir, 20, *m.sharded, m.opt.get(), {}, {}, pg, so);
    EXPECT_EQ(r.pruned, (std::vector<std::string>{"step_00000010", "step_00000005"}));
    EXPECT_FALSE(fs::exists(fs::symlink_status(dir + "/step_00000005")));
    EXPECT_EQ(files_of(other), before);
    // A shard file that is a link (to a copy of itself) is damage, named.
    const std::string step = dir + "/step_00000020";
    std::string shard;
    for (const auto& e : fs::directory_iterator(step)) {
      if (e.path().extension() == ".bin") shard = e.path().string();
    }
    fs::copy_file(shard, root + "/copy.bin");
    fs::remove(shard);
    fs::create_symlink(root + "/copy.bin", shard);
    auto fresh = make_sharded_llama(pg, "full", "block", 3);
    const std::string msg = testing::error_of<checkpoint::DamagedCheckpoint>(
        [&] { checkpoint::load_checkpoint(step, *fresh.sharded, fresh.opt.get(), pg); });
    EXPECT_CONTAINS(msg, "symbolic link");
  });
}

// Note [Carried files]: copies travel in the checkpoint (not paths), come back as files inside it,
// and a copy changed, missing or replaced by a link is damage naming it.
TEST(ShardedCheckpoint, CarriedFilesAreCopiesInsideTheCheckpoint) {
  const std::string root = testing::temp_dir("ckpt-carried");
  const std::string dir = root + "/ck", tok = root + "/tokenizer.json";
  std::ofstream(tok) << "{\"model\": \"the run's tokenizer\"}";
  testing::run_distributed(1, [&](comm::ProcessGroup& pg) {
    auto m = make_sharded_llama(pg, "full");
    checkpoint::SaveOptions so;
    so.carried = {{tok, "tokenizer.json"}};
    checkpoint::save_checkpoint(dir, 1, *m.sharded, m.opt.get(), {}, {}, pg, so);
    fs::remove(tok);  // the run's own file is gone: the checkpoint's copy is what counts
    auto fresh = make_sharded_llama(pg, "full", "block", 3);
    const std::string step = dir + "/step_00000001";
    const auto r = checkpoint::load_checkpoint(step, *fresh.sharded, fresh.opt.get(), pg);
    ASSERT_EQ(r.carried.size(), 1u);
    EXPECT_EQ(r.carried[0].name, "tokenizer.json");
    EXPECT_EQ(fs::path(r.carried[0].path).parent_path(), fs::path(step) / "carried");
    auto load_error = [&] {
      return testing::error_of<checkpoint::DamagedCheckpoint>(
          [&] { checkpoint::load_checkpoint(step, *fresh.sharded, fresh.opt.get(), pg); });
    };
    const std::string copy = step + "/carried/tokenizer.json";
    std::ofstream(copy, std::ios::app) << " ";
    EXPECT_CONTAINS(load_error(), "carried/tokenizer.json");
    fs::remove(copy);
    std::ofstream(root + "/elsewhere") << "{\"model\": \"the run's tokenizer\"}";
    fs::create_symlink(root + "/elsewhere", copy);
    EXPECT_CONTAINS(load_error(), "symbolic link");
  });
}

}  // namespace fsdp
