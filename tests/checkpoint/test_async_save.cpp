// Asynchronous saves (Note [Asynchronous save], checkpoint/async_save.h): the
// staged copy is what lands on disk while training changes the live state;
// one save in flight; a writer's error surfaces at the next poll on every
// rank and leaves the previous checkpoint the newest; the lifecycle's table.
// The trainer's use (bit-exact resume, SIGKILL during a save, exit codes) is
// in tests/train.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <thread>

#include "fsdp/checkpoint/async_save.h"
#include "fsdp/checkpoint/dcp.h"
#include "fsdp/checkpoint/sharded.h"
#include "fsdp/common/error.h"
#include "sharded_mlp.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/multiproc.h"

namespace fsdp {
namespace {

namespace fs = std::filesystem;
using checkpoint::AsyncCheckpointer;
using checkpoint::AsyncSaveState;

}  // namespace

TEST(AsyncSave, LifecycleTable) {
  using S = AsyncSaveState;
  const S all[] = {S::kIdle, S::kWriting, S::kWritten, S::kCommitting};
  int legal_changes = 0;
  for (S from : all) {
    for (S to : all) legal_changes += checkpoint::legal(from, to) ? 1 : 0;
  }
  EXPECT_EQ(legal_changes, 4);  // one cycle: idle -> writing -> written -> committing -> idle
  EXPECT_TRUE(checkpoint::legal(S::kIdle, S::kWriting));
  EXPECT_TRUE(checkpoint::legal(S::kCommitting, S::kIdle));
  EXPECT_FALSE(checkpoint::legal(S::kWriting, S::kIdle));  // a save in flight is committed, never dropped
  EXPECT_STREQ(checkpoint::to_string(S::kWritten), "kWritten");
}

// Training changes the parameters and the momentum right after start(): the
// checkpoint holds the state at start(), byte for byte what a synchronous
// save of that state wrote, in our format and in DCP's.
TEST(AsyncSave, WritesTheStagedStateWhileTrainingGoesOn) {
  const std::string dir = testing::temp_dir("async-staged");
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    for (const bool dcp : {false, true}) {
      // Names of one length: DCP's .metadata holds the checkpoint's path, and the manifest its size.
      const std::string sync_dir = dir + (dcp ? "/dcp-sync" : "/sync");
      const std::string async_dir = dir + (dcp ? "/dcp-asyn" : "/asyn");
      testing::ShardedMlp m = testing::make_mlp(pg, 5);
      for (int s = 0; s < 2; ++s) m.step(s, pg.size(), pg.rank());
      MetadataState trainer(checkpoint::kTrainerKey, {{"step", 2}});
      const std::vector<StateOwner*> owners = {&m.model, &trainer, m.opt.get()};
      checkpoint::DcpSaveOptions dcp_options;
      checkpoint::SaveOptions so;
      if (dcp) so.dcp = &dcp_options;
      checkpoint::save_checkpoint(sync_dir, 2, *m.sharded, owners, pg, so);

      AsyncCheckpointer saver;
      const checkpoint::AsyncStart s = saver.start(async_dir, 2, *m.sharded, owners, pg, so);
      EXPECT_TRUE(s.staged) << s.not_staged;
      EXPECT_GT(s.state_bytes, 0);
      EXPECT_EQ(s.staging_bytes, s.state_bytes);
      EXPECT_FALSE(s.waited_for);
      EXPECT_EQ(saver.state(), AsyncSaveState::kWriting);
      EXPECT_EQ(saver.in_flight_step(), 2);
      EXPECT_EQ(s.path, async_dir + "/step_00000002");
      for (int i = 2; i < 4; ++i) m.step(i, pg.size(), pg.rank());  // the live state moves on
      trainer = MetadataState(checkpoint::kTrainerKey, {{"step", 4}});
      const auto c = saver.finish(pg);
      ASSERT_TRUE(c.has_value());
      EXPECT_EQ(c->step, 2);
      EXPECT_EQ(c->result.path, async_dir + "/step_00000002");
      EXPECT_EQ(saver.state(), AsyncSaveState::kIdle);
      EXPECT_EQ(saver.in_flight_step(), -1);
      EXPECT_EQ(saver.staging_bytes(), s.state_bytes);  // kept for the next save
      EXPECT_FALSE(saver.finish(pg).has_value());       // nothing in flight
      pg.barrier(std::chrono::seconds(60));
      if (pg.rank() == 0) {
        EXPECT_GE(testing::expect_same_files(sync_dir + "/step_00000002", async_dir + "/step_00000002"), 4);
      }
    }
  });
}

// A second start() while a save is in flight waits for it and commits it
// first; poll() commits once every rank's writer ended; the staging buffers
// are reused.
TEST(AsyncSave, OneSaveInFlight) {
  const std::string dir = testing::temp_dir("async-one");
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    testing::ShardedMlp m = testing::make_mlp(pg, 5);
    AsyncCheckpointer saver;
    checkpoint::SaveOptions so;
    so.keep_last = 2;
    m.step(0, pg.size(), pg.rank());
    const auto first = saver.start(dir, 1, *m.sharded, {&m.model, m.opt.get()}, pg, so);
    m.step(1, pg.size(), pg.rank());
    const auto second = saver.start(dir, 2, *m.sharded, {&m.model, m.opt.get()}, pg, so);
    ASSERT_TRUE(second.waited_for.has_value());
    EXPECT_EQ(second.waited_for->step, 1);
    EXPECT_TRUE(fs::exists(dir + "/step_00000001/manifest.json"));
    EXPECT_EQ(second.staging_bytes, first.staging_bytes);  // reused, not grown
    // poll() is collective; once the writers ended it commits.
    std::optional<checkpoint::AsyncCommit> c;
    for (int i = 0; i < 2000 && !c; ++i) {
      c = saver.poll(pg);
      if (!c) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_TRUE(c.has_value()) << "the writers of step 2 never ended";
    EXPECT_EQ(c->step, 2);
    EXPECT_FALSE(saver.poll(pg).has_value());  // idle: no collective, nothing to commit
    m.step(2, pg.size(), pg.rank());
    saver.start(dir, 3, *m.sharded, {&m.model, m.opt.get()}, pg, so);
    saver.finish(pg);
    const auto kept = checkpoint::list_checkpoints(dir);
    ASSERT_EQ(kept.size(), 2u);  // keep_last as a synchronous save
    EXPECT_EQ(kept[0].step, 3);
    EXPECT_EQ(kept[1].step, 2);
  });
}

// Rank 1's writer fails (a file size limit: write() returns EFBIG). The
// error surfaces at the next poll, on every rank, naming the checkpoint and
// the rank; the temporary directory is gone and the previous checkpoint is
// the newest; the next save works.
TEST(AsyncSave, WriterErrorSurfacesAtTheNextPollOnEveryRank) {
  const std::string dir = testing::temp_dir("async-error");
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    testing::ShardedMlp m = testing::make_mlp(pg, 5);
    AsyncCheckpointer saver;
    m.step(0, pg.size(), pg.rank());
    saver.start(dir, 1, *m.sharded, {&m.model, m.opt.get()}, pg, {});
    saver.finish(pg);
    m.step(1, pg.size(), pg.rank());
    rlimit old{};
    ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
    if (pg.rank() == 1) {
      std::signal(SIGXFSZ, SIG_IGN);  // write() fails with EFBIG instead of killing the process
      rlimit small = old;
      small.rlim_cur = 256;  // this rank's shard file is ~2 KB
      ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
    }
    saver.start(dir, 2, *m.sharded, {&m.model, m.opt.get()}, pg, {});
    std::string message;
    for (int i = 0; i < 2000 && message.empty(); ++i) {
      try {
        if (saver.poll(pg)) break;  // committed: the writer did not fail
      } catch (const Failure& e) {
        message = e.what();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old), 0);
    EXPECT_CONTAINS(message, "saving checkpoint " + dir + "/step_00000002 failed");
    EXPECT_CONTAINS(message, "rank 1");
    EXPECT_CONTAINS(message, "File too large");
    EXPECT_EQ(saver.state(), AsyncSaveState::kIdle);
    pg.barrier(std::chrono::seconds(60));
    EXPECT_FALSE(fs::exists(dir + "/.tmp-step_00000002"));
    EXPECT_FALSE(fs::exists(dir + "/step_00000002"));
    const auto kept = checkpoint::list_checkpoints(dir);
    ASSERT_EQ(kept.size(), 1u);
    EXPECT_EQ(kept[0].step, 1);
    saver.start(dir, 2, *m.sharded, {&m.model, m.opt.get()}, pg, {});
    EXPECT_TRUE(saver.finish(pg).has_value());
    EXPECT_TRUE(fs::exists(dir + "/step_00000002/manifest.json"));
  });
}

// A staging limit below the state: written before start() returns, said
// why; committed as any other.
TEST(AsyncSave, OverTheStagingLimitSavesSynchronously) {
  const std::string dir = testing::temp_dir("async-limit");
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    testing::ShardedMlp m = testing::make_mlp(pg, 5);
    AsyncCheckpointer saver(checkpoint::AsyncSaveOptions{64});
    const auto s = saver.start(dir, 0, *m.sharded, {&m.model, m.opt.get()}, pg, {});
    EXPECT_FALSE(s.staged);
    EXPECT_CONTAINS(s.not_staged, "exceeds the staging limit 64 B (AsyncSaveOptions::staging_limit)");
    EXPECT_EQ(s.staging_bytes, 0);
    EXPECT_EQ(saver.state(), AsyncSaveState::kWriting);
    EXPECT_TRUE(saver.finish(pg).has_value());
    EXPECT_TRUE(fs::exists(dir + "/step_00000000/manifest.json"));
  });
}

}  // namespace fsdp
