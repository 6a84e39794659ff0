// Local launcher: environment, failure propagation, signals, timeouts, no leaks.
// Workers are /bin/sh scripts; the gtest binary as a worker is covered by the
// run_distributed tests.
#include <gtest/gtest.h>

#include "fsdp/comm/launcher.h"
#include "fsdp/common/error.h"
#include "support/multiproc.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

namespace fsdp::comm {
namespace {

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "in: " << (haystack)

LaunchOptions sh(const std::string& script, int nproc, const std::string& log_dir) {
  LaunchOptions o;
  o.argv = {"/bin/sh", "-c", script};
  o.nproc = nproc;
  o.log_dir = log_dir;
  o.kill_grace = std::chrono::seconds(5);
  o.timeout = std::chrono::seconds(60);  // a safety net; no test comes near it
  return o;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST(Launcher, AllRanksSucceedWithTorchrunEnvironment) {
  const std::string dir = testing::temp_dir("logs");
  LaunchOptions o = sh(
      "echo \"rank=$RANK world=$WORLD_SIZE local=$LOCAL_RANK/$LOCAL_WORLD_SIZE group=$GROUP_RANK "
      "addr=$MASTER_ADDR port=$MASTER_PORT agent=$TORCHELASTIC_USE_AGENT_STORE "
      "restart=$TORCHELASTIC_RESTART_COUNT run=$TORCHELASTIC_RUN_ID launcher=$FSDP_LAUNCHER "
      "extra=$EXTRA gone=${GONE:-unset}\"",
      4, dir);
  o.local_world_size = 2;
  o.env = {{"EXTRA", "x y"}};
  o.run_id = "run42";
  setenv("GONE", "present", 1);
  o.unset_env = {"GONE"};
  const LaunchResult r = launch_local(o);
  unsetenv("GONE");
  ASSERT_TRUE(r.ok) << r.message;
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.failed_rank, -1);
  EXPECT_EQ(r.message, "all 4 ranks exited with code 0");
  ASSERT_EQ(r.ranks.size(), 4u);
  for (int rank = 0; rank < 4; ++rank) {
    const auto& out = r.ranks[rank];
    EXPECT_EQ(out.rank, rank);
    EXPECT_FALSE(out.signaled);
    EXPECT_EQ(out.code, 0);
    EXPECT_FALSE(out.stopped);
    const std::string log = read_file(out.log_file);
    EXPECT_HAS(log, "rank=" + std::to_string(rank) + " world=4 local=" + std::to_string(rank % 2) +
                        "/2 group=" + std::to_string(rank / 2) + " addr=127.0.0.1 port=");
    EXPECT_HAS(log, "agent=True restart=0 run=run42 launcher=fsdp-train extra=x y gone=unset");
    EXPECT_EQ(log.find("port=0 "), std::string::npos) << log;
  }
}

// Node 1 of 2 (it hosts no store: its workers would connect to node 0's):
// global ranks 2 and 3 in the environment, the outcomes and the messages.
TEST(Launcher, SecondNodeStartsItsGlobalRanks) {
  const std::string dir = testing::temp_dir("logs");
  LaunchOptions o = sh(
      "echo \"rank=$RANK world=$WORLD_SIZE local=$LOCAL_RANK/$LOCAL_WORLD_SIZE group=$GROUP_RANK/$GROUP_WORLD_SIZE "
      "addr=$MASTER_ADDR port=$MASTER_PORT run=$TORCHELASTIC_RUN_ID\"; [ $RANK = 3 ] && exit 4; exit 0",
      2, dir);
  o.nnodes = 2;
  o.node_rank = 1;
  o.master_addr = "10.0.0.1";
  o.master_port = 29555;
  const LaunchResult r = launch_local(o);
  ASSERT_EQ(r.ranks.size(), 2u);
  EXPECT_EQ(r.ranks[0].rank, 2);
  EXPECT_EQ(r.ranks[1].rank, 3);
  EXPECT_HAS(read_file(r.ranks[0].log_file),
             "rank=2 world=4 local=0/2 group=1/2 addr=10.0.0.1 port=29555 run=fsdp-10.0.0.1-29555");
  EXPECT_HAS(read_file(dir + "/rank3.log"), "rank=3 world=4 local=1/2 group=1/2");
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.exit_code, 4);
  EXPECT_EQ(r.ranks[static_cast<size_t>(r.failed_rank)].rank, 3);
  EXPECT_HAS(r.message, "rank 3 exited with code 4");
}

// Note [Several ranks on one GPU]: with nccl_host_per_rank each worker gets
// its own NCCL_HOSTID (after the user's, when one is set); without it the
// workers inherit the environment's, so NCCL's duplicate-GPU refusal stands.
TEST(Launcher, EachRankGetsItsOwnNcclHostIdWhenRanksShareAGpu) {
  auto host_ids = [](bool per_rank, const char* given) {
    const std::string dir = testing::temp_dir("logs");
    LaunchOptions o = sh("echo \"host=${NCCL_HOSTID:-unset}\"", 3, dir);
    o.run_id = "run7";
    o.nccl_host_per_rank = per_rank;
    if (given != nullptr) o.env = {{"NCCL_HOSTID", given}};
    const LaunchResult r = launch_local(o);
    EXPECT_TRUE(r.ok) << r.message;
    std::vector<std::string> ids;
    for (const auto& rank : r.ranks) {
      const std::string log = read_file(rank.log_file);
      const size_t at = log.find("host=");
      ids.push_back(at == std::string::npos ? "?" : log.substr(at + 5, log.find('\n', at) - at - 5));
    }
    return ids;
  };
  unsetenv("NCCL_HOSTID");  // only what the launcher gives
  EXPECT_EQ(host_ids(true, nullptr), (std::vector<std::string>{"run7-rank0", "run7-rank1", "run7-rank2"}));
  EXPECT_EQ(host_ids(true, "box"), (std::vector<std::string>{"box-rank0", "box-rank1", "box-rank2"}));
  EXPECT_EQ(host_ids(false, nullptr), (std::vector<std::string>{"unset", "unset", "unset"}));
  EXPECT_EQ(host_ids(false, "box"), (std::vector<std::string>{"box", "box", "box"}));
}

TEST(Launcher, FailingRankIsNamedAndOthersAreStopped) {
  const auto start = std::chrono::steady_clock::now();
  const LaunchResult r = launch_local(
      sh("if [ \"$RANK\" = 1 ]; then sleep 0.2; exit 3; fi; sleep 30", 3, testing::temp_dir("logs")));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.failed_rank, 1);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(launch_exit_code(r), 3);
  EXPECT_EQ(r.message, "rank 1 exited with code 3; stopped ranks 0, 2");
  for (int rank : {0, 2}) {
    EXPECT_TRUE(r.ranks[rank].stopped);
    EXPECT_TRUE(r.ranks[rank].signaled);
    EXPECT_EQ(r.ranks[rank].signal, SIGTERM);
  }
}

TEST(Launcher, RankKilledBySignalIsNamed) {
  const LaunchResult r =
      launch_local(sh("if [ \"$RANK\" = 0 ]; then kill -9 $$; fi; sleep 30", 2, testing::temp_dir("logs")));
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.failed_rank, 0);
  EXPECT_EQ(r.exit_code, 128 + 9);
  EXPECT_HAS(r.message, "rank 0 was killed by signal 9 (Killed)");
  EXPECT_HAS(r.message, "stopped rank 1");
}

TEST(Launcher, TimeoutStopsEveryoneAndNamesThem) {
  LaunchOptions o = sh("if [ \"$RANK\" = 1 ]; then exit 0; fi; sleep 30", 3, testing::temp_dir("logs"));
  o.timeout = std::chrono::milliseconds(1500);
  const LaunchResult r = launch_local(o);
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.exit_code, 124);
  EXPECT_EQ(r.message, "timed out after 1500 ms; ranks 0, 2 were still running (stopped)");
  EXPECT_FALSE(r.ranks[1].stopped);
}

TEST(Launcher, WorkersIgnoringSigtermAreKilledAfterTheGrace) {
  LaunchOptions o = sh("if [ \"$RANK\" = 1 ]; then sleep 0.3; exit 1; fi; trap '' TERM; sleep 30", 2,
                       testing::temp_dir("logs"));
  o.kill_grace = std::chrono::milliseconds(500);
  const auto start = std::chrono::steady_clock::now();
  const LaunchResult r = launch_local(o);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_EQ(r.failed_rank, 1);
  EXPECT_TRUE(r.ranks[0].signaled);
  EXPECT_EQ(r.ranks[0].signal, SIGKILL);
}

// Gone, or dead and waiting for whoever adopted it to reap it.
bool process_gone(pid_t pid) {
  for (int i = 0; i < 500; ++i) {
    if (kill(pid, 0) != 0 && errno == ESRCH) return true;
    const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
    const auto paren = stat.rfind(')');
    if (paren != std::string::npos && stat.size() > paren + 2 && stat[paren + 2] == 'Z') return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST(Launcher, LeftoverChildrenOfAWorkerAreKilled) {
  const LaunchResult r =
      launch_local(sh("sleep 30 & echo \"child=$!\"", 1, testing::temp_dir("logs")));
  ASSERT_TRUE(r.ok) << r.message;
  const std::string log = read_file(r.ranks[0].log_file);
  const auto pos = log.find("child=");
  ASSERT_NE(pos, std::string::npos) << log;
  const pid_t child = std::stoi(log.substr(pos + 6));
  EXPECT_TRUE(process_gone(child)) << "pid " << child << " outlived its worker";
}

TEST(Launcher, SigtermToTheLauncherIsForwardedAndWorkersMayExitCleanly) {
  const std::string dir = testing::temp_dir("logs");
  LaunchOptions o = sh("trap 'echo got-term; exit 0' TERM; echo ready; sleep 30 & wait", 2, dir);
  std::atomic<bool> done{false};
  std::thread sender([&] {
    // Wait until both workers run (so the launcher's handler is installed), then signal it.
    for (int i = 0; i < 2000 && !done; ++i) {
      if (testing::tail_file(dir + "/rank0.log").find("ready") != std::string::npos &&
          testing::tail_file(dir + "/rank1.log").find("ready") != std::string::npos) {
        kill(getpid(), SIGTERM);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  const LaunchResult r = launch_local(o);
  done = true;
  sender.join();
  EXPECT_EQ(r.signal_received, SIGTERM);
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_HAS(r.message, "received signal 15");
  for (const auto& out : r.ranks) EXPECT_HAS(testing::tail_file(out.log_file), "got-term");
}

// Issue 16: a rank suspended with SIGSTOP makes the others time out; the
// launcher used to blame the rank that noticed ("rank 0 exited with code 1;
// stopped rank 1"). Now the suspended rank is the failed one.
TEST(Launcher, SuspendedRankIsBlamedNotTheRankThatNoticed) {
  const LaunchResult r = launch_local(
      sh("if [ \"$RANK\" = 1 ]; then kill -STOP $$; sleep 30; fi; sleep 0.5; exit 1", 2, testing::temp_dir("logs")));
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.failed_rank, 1);
  EXPECT_TRUE(r.ranks[1].suspended);
  EXPECT_FALSE(r.ranks[0].suspended);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.message,
            "rank 1 was suspended (process state T, e.g. SIGSTOP): the others waited for it (rank 0 exited with "
            "code 1); stopped rank 1");
}

// Waits until every rank's log says "ready", then sends SIGTERM to this process (the launcher).
std::thread sigterm_when_ready(const std::string& dir, int nproc, const std::atomic<bool>& done) {
  return std::thread([&done, dir, nproc] {
    for (int i = 0; i < 2000 && !done; ++i) {
      int ready = 0;
      for (int r = 0; r < nproc; ++r) {
        ready += testing::tail_file(dir + "/rank" + std::to_string(r) + ".log").find("ready") != std::string::npos;
      }
      if (ready == nproc) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // rank 1 suspends itself after "ready"
        kill(getpid(), SIGTERM);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
}

// Issue 16: SIGTERM to the launcher while a worker is suspended used to leave
// the launcher waiting forever (the worker never ran its handler). The
// forwarded signal comes with SIGCONT.
TEST(Launcher, ForwardedSignalReachesASuspendedWorker) {
  const std::string dir = testing::temp_dir("logs");
  LaunchOptions o = sh(
      "trap 'echo got-term; exit 0' TERM; echo ready; if [ \"$RANK\" = 1 ]; then kill -STOP $$; fi; "
      "sleep 30 & wait",
      2, dir);
  o.timeout = std::chrono::seconds(20);  // the old launcher waited until this safety net
  std::atomic<bool> done{false};
  std::thread sender = sigterm_when_ready(dir, 2, done);
  const LaunchResult r = launch_local(o);
  done = true;
  sender.join();
  EXPECT_FALSE(r.timed_out) << r.message;
  EXPECT_TRUE(r.ok) << r.message;
  for (const auto& out : r.ranks) EXPECT_HAS(testing::tail_file(out.log_file), "got-term");
}

// Issue 16: the first forwarded signal arms a deadline: workers that ignore
// it are stopped after signal_timeout (SIGTERM, SIGKILL after the grace).
TEST(Launcher, WorkersIgnoringAForwardedSignalAreStoppedAfterTheSignalTimeout) {
  const std::string dir = testing::temp_dir("logs");
  LaunchOptions o = sh("trap '' TERM INT; echo ready; sleep 30", 2, dir);
  o.signal_timeout = std::chrono::milliseconds(500);
  o.kill_grace = std::chrono::milliseconds(500);
  std::atomic<bool> done{false};
  std::thread sender = sigterm_when_ready(dir, 2, done);
  const LaunchResult r = launch_local(o);
  done = true;
  sender.join();
  EXPECT_FALSE(r.ok);
  EXPECT_FALSE(r.timed_out) << r.message;
  EXPECT_EQ(r.signal_received, SIGTERM);
  for (const auto& out : r.ranks) {
    EXPECT_TRUE(out.stopped);
    EXPECT_TRUE(out.signaled);
    EXPECT_EQ(out.signal, SIGKILL);
  }
  EXPECT_HAS(r.message, "they did not all exit within 500 ms, so the launcher stopped ranks 0, 1");
  EXPECT_EQ(r.exit_code, 128 + SIGTERM);
}

// Issue 16: the first stderr line of a failure was the surviving rank's error.
// With on_failure, the workers' fatal lines wait until the summary is out;
// other lines pass through as they come.
TEST(Launcher, FailureSummaryComesBeforeTheWorkersErrorLines) {
  LaunchOptions o = sh(
      "echo \"note from $RANK\" >&2; if [ \"$RANK\" = 1 ]; then sleep 0.3; echo 'prog: error: bad input' >&2; exit 2; fi; "
      "trap \"echo 'prog: failed: [rank 0/2] rank 1 closed its connection' >&2; exit 1\" TERM; sleep 30",
      2, "");
  o.on_failure = [](const std::string& summary) { std::cerr << "SUMMARY " << summary << std::endl; };
  ::testing::internal::CaptureStderr();
  const LaunchResult r = launch_local(o);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(r.failed_rank, 1);
  const auto summary = err.find("SUMMARY rank 1 exited with code 2\n");
  ASSERT_NE(summary, std::string::npos) << err;
  EXPECT_LT(err.find("note from 0"), summary) << err;  // ordinary lines are not held
  EXPECT_LT(err.find("note from 1"), summary) << err;
  const auto own = err.find("prog: error: bad input");
  const auto survivor = err.find("prog: failed: [rank 0/2]");
  ASSERT_NE(own, std::string::npos) << err;
  ASSERT_NE(survivor, std::string::npos) << err;
  EXPECT_GT(own, summary) << err;
  EXPECT_GT(survivor, summary) << err;
  EXPECT_EQ(err.find("SUMMARY", summary + 1), std::string::npos) << err;  // once
}

TEST(Launcher, BadOptionsAreUsageErrors) {
  LaunchOptions o;
  EXPECT_THROW(launch_local(o), UsageError);  // empty argv
  o.argv = {"/definitely/not/a/program"};
  EXPECT_THROW(launch_local(o), UsageError);
  o.argv = {"no-such-program-fsdp-test"};
  EXPECT_THROW(launch_local(o), UsageError);
  o.argv = {"true"};
  o.nproc = 0;
  EXPECT_THROW(launch_local(o), UsageError);
  o.nproc = 3;
  o.local_world_size = 2;
  EXPECT_THROW(launch_local(o), UsageError);
  o.local_world_size = 0;
  o.log_dir = "/definitely/not/a/dir";
  EXPECT_THROW(launch_local(o), UsageError);
  o.log_dir = "";
  o.nnodes = 2;  // several nodes: node 0's address and port are needed, and a node rank below nnodes
  EXPECT_THROW(launch_local(o), UsageError);
  o.master_addr = "10.0.0.1";
  o.master_port = 0;
  EXPECT_THROW(launch_local(o), UsageError);
  o.master_port = 29555;
  o.node_rank = 2;
  EXPECT_THROW(launch_local(o), UsageError);
  o.nnodes = 1;
  o.node_rank = 0;
  const LaunchResult r = launch_local(o);  // PATH lookup, pass-through output
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(Launcher, StartJobRefusesBadArgumentsBeforeStartingAnything) {
  char prog[] = "prog";
  char* argv[] = {prog, nullptr};
  EXPECT_THROW(start_job("prog", 1, argv, 0, "cpu"), UsageError);
  EXPECT_THROW(start_job("prog", 1, argv, 2, "tpu"), UsageError);
  // One process on the CPU outside any launcher: a world of one, no launch.
  const Job job = start_job("prog", 1, argv, 1, "cpu");
  EXPECT_FALSE(job.launched.has_value());
  EXPECT_EQ(job.runtime.world.world_size, 1);
  EXPECT_TRUE(job.device.is_cpu());
}

TEST(Launcher, ExitCodeMapping) {
  LaunchResult r;
  r.ranks.resize(2);
  r.ok = true;
  EXPECT_EQ(launch_exit_code(r), 0);
  r.ok = false;
  r.failed_rank = 1;
  r.ranks[1].signaled = true;
  r.ranks[1].signal = SIGSEGV;
  EXPECT_EQ(launch_exit_code(r), 128 + SIGSEGV);
  r.timed_out = true;
  EXPECT_EQ(launch_exit_code(r), 124);
  LaunchResult interrupted;
  interrupted.ranks.resize(1);
  interrupted.signal_received = SIGINT;
  interrupted.ranks[0].signaled = true;
  interrupted.ranks[0].signal = SIGINT;
  EXPECT_EQ(launch_exit_code(interrupted), 130);
}

}  // namespace
}  // namespace fsdp::comm
