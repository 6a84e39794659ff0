// Rendezvous from the environment: torchrun, Kubeflow (plain env), Slurm, none.
// Pure parsing (detect_world through a fake getenv) plus in-process init.
#include <gtest/gtest.h>

#include "fsdp/comm/backends.h"
#include "fsdp/comm/rendezvous.h"
#include "fsdp/common/error.h"
#include "comm/comm_test_util.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <thread>

namespace fsdp::comm {
namespace {

using test::free_port;

using Vars = std::map<std::string, std::string>;

WorldInfo detect(const Vars& vars) {
  return detect_world([&](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
}

// The UsageError message detect() throws, or "" (and a test failure) if none.
std::string usage_error(const Vars& vars) {
  try {
    detect(vars);
  } catch (const UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UsageError";
  return "";
}

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "in: " << (haystack)

TEST(Rendezvous, NoVariablesIsASingleProcess) {
  const WorldInfo w = detect({});
  EXPECT_EQ(w.rank, 0);
  EXPECT_EQ(w.world_size, 1);
  EXPECT_EQ(w.local_rank, 0);
  EXPECT_EQ(w.local_world_size, 1);
  EXPECT_EQ(w.node_rank, 0);
  EXPECT_EQ(w.master_addr, "");
  EXPECT_FALSE(w.agent_store);
  EXPECT_EQ(w.launcher, "single");
}

TEST(Rendezvous, TorchrunUsesTheAgentStoreWithAttemptPrefix) {
  const WorldInfo w = detect({{"RANK", "5"},
                              {"WORLD_SIZE", "8"},
                              {"LOCAL_RANK", "1"},
                              {"LOCAL_WORLD_SIZE", "4"},
                              {"GROUP_RANK", "1"},
                              {"MASTER_ADDR", "node01"},
                              {"MASTER_PORT", "29500"},
                              {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                              {"TORCHELASTIC_RESTART_COUNT", "2"},
                              {"TORCHELASTIC_RUN_ID", "abc"},
                              {"GLOO_SOCKET_IFNAME", "eth1,eth2"}});
  EXPECT_EQ(w.rank, 5);
  EXPECT_EQ(w.world_size, 8);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_world_size, 4);
  EXPECT_EQ(w.node_rank, 1);
  EXPECT_EQ(w.master_addr, "node01");
  EXPECT_EQ(w.master_port, 29500);
  EXPECT_TRUE(w.agent_store);
  EXPECT_EQ(w.store_prefix, "/worker/fsdp");  // not the restart count: agents count their own
  EXPECT_EQ(w.launcher, "torchrun");
  EXPECT_EQ(w.socket_ifname, "eth1");
}

TEST(Rendezvous, OurLauncherNamesItselfAndNonAgentTorchrunHasNoPrefix) {
  Vars v{{"RANK", "0"},         {"WORLD_SIZE", "2"},      {"MASTER_ADDR", "127.0.0.1"},
         {"MASTER_PORT", "1234"}, {"TORCHELASTIC_RUN_ID", "x"}, {"FSDP_LAUNCHER", "fsdp-train"},
         {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
  WorldInfo w = detect(v);
  EXPECT_EQ(w.launcher, "fsdp-train");
  EXPECT_EQ(w.store_prefix, "/worker/fsdp");
  EXPECT_EQ(w.local_world_size, 2);  // defaults to one node
  v["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  w = detect(v);
  EXPECT_FALSE(w.agent_store);
  EXPECT_EQ(w.store_prefix, "");
  v["TORCHELASTIC_USE_AGENT_STORE"] = "maybe";
  EXPECT_HAS(usage_error(v), "TORCHELASTIC_USE_AGENT_STORE='maybe' is not a boolean");
}

TEST(Rendezvous, KubeflowPlainEnv) {
  const WorldInfo w = detect({{"MASTER_ADDR", "pytorchjob-master-0"},
                              {"MASTER_PORT", "23456"},
                              {"RANK", "3"},
                              {"WORLD_SIZE", "4"}});
  EXPECT_EQ(w.launcher, "env");
  EXPECT_EQ(w.rank, 3);
  EXPECT_EQ(w.world_size, 4);
  EXPECT_EQ(w.local_rank, 0);
  EXPECT_EQ(w.local_world_size, 1);
  EXPECT_EQ(w.node_rank, 3);
  EXPECT_FALSE(w.agent_store);
  EXPECT_EQ(w.master_addr, "pytorchjob-master-0");
  EXPECT_EQ(w.master_port, 23456);

  const WorldInfo w2 = detect({{"MASTER_ADDR", "m"}, {"MASTER_PORT", "1"}, {"RANK", "5"},
                               {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}});
  EXPECT_EQ(w2.local_rank, 1);
  EXPECT_EQ(w2.local_world_size, 4);
  EXPECT_EQ(w2.node_rank, 1);
  // A world of one needs no master.
  EXPECT_EQ(detect({{"RANK", "0"}, {"WORLD_SIZE", "1"}}).world_size, 1);
}

TEST(Rendezvous, MalformedValuesNameTheVariable) {
  const Vars ok{{"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}, {"RANK", "1"}, {"WORLD_SIZE", "4"}};
  auto with = [&](const std::string& k, const std::string& v) {
    Vars x = ok;
    x[k] = v;
    return x;
  };
  auto without = [&](const std::string& k) {
    Vars x = ok;
    x.erase(k);
    return x;
  };
  EXPECT_HAS(usage_error(with("RANK", "abc")), "RANK='abc' is not a non-negative integer");
  EXPECT_HAS(usage_error(with("RANK", "-1")), "RANK='-1'");
  EXPECT_HAS(usage_error(with("RANK", "4")), "RANK=4 is not below WORLD_SIZE=4");
  EXPECT_HAS(usage_error(with("WORLD_SIZE", "0")), "WORLD_SIZE=0 is outside the valid range");
  EXPECT_HAS(usage_error(with("MASTER_PORT", "70000")), "MASTER_PORT=70000 is outside");
  EXPECT_HAS(usage_error(with("MASTER_PORT", "12ab")), "MASTER_PORT='12ab'");
  EXPECT_HAS(usage_error(without("MASTER_ADDR")), "MASTER_ADDR is not set but WORLD_SIZE=4");
  EXPECT_HAS(usage_error(without("MASTER_PORT")), "MASTER_PORT is not set");
  EXPECT_HAS(usage_error(without("WORLD_SIZE")), "WORLD_SIZE is not set");
  EXPECT_HAS(usage_error(without("RANK")), "RANK is not set");
  Vars bad_local = with("LOCAL_WORLD_SIZE", "2");
  bad_local["LOCAL_RANK"] = "2";
  EXPECT_HAS(usage_error(bad_local), "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2");
  EXPECT_HAS(usage_error(with("LOCAL_WORLD_SIZE", "8")), "LOCAL_WORLD_SIZE=8 must be between 1 and WORLD_SIZE=4");
  Vars elastic = ok;
  elastic["TORCHELASTIC_RUN_ID"] = "r";
  elastic.erase("MASTER_ADDR");
  EXPECT_HAS(usage_error(elastic), "MASTER_ADDR is not set");
}

TEST(Rendezvous, SlurmVariables) {
  const Vars base{{"SLURM_PROCID", "5"},
                  {"SLURM_NTASKS", "8"},
                  {"SLURM_LOCALID", "1"},
                  {"SLURM_NODEID", "1"},
                  {"SLURM_JOB_ID", "123456"},
                  {"SLURM_JOB_NODELIST", "gpu[07-08]"},
                  {"SLURM_TASKS_PER_NODE", "4(x2)"}};
  WorldInfo w = detect(base);
  EXPECT_EQ(w.launcher, "slurm");
  EXPECT_EQ(w.rank, 5);
  EXPECT_EQ(w.world_size, 8);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_world_size, 4);
  EXPECT_EQ(w.node_rank, 1);
  EXPECT_EQ(w.master_addr, "gpu07");
  EXPECT_EQ(w.master_port, 15000 + 3456);
  EXPECT_EQ(w.master_port, slurm_default_port(123456));
  EXPECT_FALSE(w.agent_store);

  Vars v = base;
  v["MASTER_PORT"] = "29400";
  v["MASTER_ADDR"] = "10.0.0.1";
  v["SLURM_STEP_NODELIST"] = "b[3-4]";
  w = detect(v);
  EXPECT_EQ(w.master_port, 29400);
  EXPECT_EQ(w.master_addr, "10.0.0.1");
  v.erase("MASTER_ADDR");
  EXPECT_EQ(detect(v).master_addr, "b3");  // the step's nodes win over the job's

  // Uneven nodes: the entry for this node.
  v = base;
  v["SLURM_TASKS_PER_NODE"] = "3,5";
  v["SLURM_PROCID"] = "4";
  v["SLURM_LOCALID"] = "1";
  EXPECT_EQ(detect(v).local_world_size, 5);
  v["SLURM_STEP_TASKS_PER_NODE"] = "2(x2)";
  EXPECT_EQ(detect(v).local_world_size, 2);
  v.erase("SLURM_STEP_TASKS_PER_NODE");
  v["SLURM_NTASKS_PER_NODE"] = "4";
  EXPECT_EQ(detect(v).local_world_size, 4);

  // Plain env wins over Slurm (a script exporting RANK inside an allocation).
  v = base;
  v["RANK"] = "0";
  v["WORLD_SIZE"] = "1";
  EXPECT_EQ(detect(v).launcher, "env");

  v = base;
  v["SLURM_PROCID"] = "8";
  EXPECT_HAS(usage_error(v), "SLURM_PROCID=8 is not below SLURM_NTASKS=8");
  v = base;
  v.erase("SLURM_JOB_NODELIST");
  EXPECT_HAS(usage_error(v), "MASTER_ADDR (or SLURM_JOB_NODELIST) is not set");
  v = base;
  v["SLURM_JOB_NODELIST"] = "gpu[07-";
  EXPECT_HAS(usage_error(v), "SLURM_JOB_NODELIST='gpu[07-'");
  v = base;
  v["SLURM_TASKS_PER_NODE"] = "4(x";
  EXPECT_HAS(usage_error(v), "SLURM_TASKS_PER_NODE='4(x'");
  v = base;
  v["SLURM_TASKS_PER_NODE"] = "4,4";
  v["SLURM_NODEID"] = "2";
  EXPECT_HAS(usage_error(v), "lists 2 nodes but SLURM_NODEID=2");
}

TEST(Rendezvous, SlurmNodelistExpansion) {
  using V = std::vector<std::string>;
  EXPECT_EQ(expand_slurm_nodelist("node[01-03,7],gpu-a,x[1-2]-ib"),
            (V{"node01", "node02", "node03", "node7", "gpu-a", "x1-ib", "x2-ib"}));
  EXPECT_EQ(expand_slurm_nodelist("single"), (V{"single"}));
  EXPECT_EQ(expand_slurm_nodelist("n[008-010]"), (V{"n008", "n009", "n010"}));
  EXPECT_EQ(expand_slurm_nodelist("n[9-11]"), (V{"n9", "n10", "n11"}));
  EXPECT_EQ(expand_slurm_nodelist("r[1-2]n[1,3]"), (V{"r1n1", "r1n3", "r2n1", "r2n3"}));
  EXPECT_EQ(expand_slurm_nodelist("a,b[5]"), (V{"a", "b5"}));
  for (const std::string bad : {"node[1-", "node1]", "n[3-1]", "n[a-b]", "", "a,,b", "n[]",
                                "n[[1]]", "n[1-2-3]"}) {
    try {
      expand_slurm_nodelist(bad, "SLURM_JOB_NODELIST");
      ADD_FAILURE() << "no error for '" << bad << "'";
    } catch (const UsageError& e) {
      EXPECT_HAS(e.what(), "SLURM_JOB_NODELIST='" + bad + "'");
    }
  }
}

TEST(Rendezvous, SlurmTasksPerNode) {
  EXPECT_EQ(expand_slurm_tasks_per_node("2(x3),1"), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(expand_slurm_tasks_per_node("4"), (std::vector<int>{4}));
  EXPECT_THROW(expand_slurm_tasks_per_node("x"), UsageError);
  EXPECT_THROW(expand_slurm_tasks_per_node("2(x)"), UsageError);
  EXPECT_THROW(expand_slurm_tasks_per_node("2,"), UsageError);
}

TEST(Rendezvous, SingleProcessInitNeedsNoNetwork) {
  Runtime rt = init_process_group(detect({}));
  ASSERT_TRUE(rt.store);
  ASSERT_TRUE(rt.world_group);
  EXPECT_EQ(rt.world_group->size(), 1);
  EXPECT_EQ(rt.world_group->name(), "world");
  EXPECT_EQ(rt.world_group->backend(), "tcp");
  auto t = at::arange(5, at::kFloat);
  rt.world_group->all_reduce(t, ReduceOp::kAvg)->wait();
  EXPECT_TRUE(t.equal(at::arange(5, at::kFloat)));
  rt.world_group->barrier(std::chrono::milliseconds(100));
  rt.store->set("k", std::vector<uint8_t>{1, 2});
  EXPECT_EQ(rt.store->get("k"), (std::vector<uint8_t>{1, 2}));

  InitOptions nccl;
  nccl.backend = "nccl";
  if (!nccl_available()) {
    try {
      init_process_group(detect({}), nccl);
      ADD_FAILURE() << "nccl without NCCL";
    } catch (const UsageError& e) {
      EXPECT_HAS(e.what(), "-DFSDP_WITH_NCCL=ON");
    }
  }
  InitOptions bad;
  bad.backend = "mpi";
  EXPECT_THROW(init_process_group(detect({}), bad), UsageError);
  // "gloo" is PyTorch's ProcessGroupGloo (no alias of ours any more), named in the log's transport.
  InitOptions gloo;
  gloo.backend = "gloo";
  const Runtime g = init_process_group(detect({}), gloo);
  EXPECT_EQ(g.world_group->backend(), "c10d-gloo");
  EXPECT_HAS(g.world_group->transport(), "c10d ProcessGroupGloo (LibTorch ");
  EXPECT_EQ(g.cpu_group, nullptr);
  InitOptions c10d_nccl;
  c10d_nccl.backend = "c10d-nccl";
  if (!torch_nccl_available()) {
    try {
      init_process_group(detect({}), c10d_nccl);
      ADD_FAILURE() << "c10d-nccl without a CUDA build";
    } catch (const UsageError& e) {
      EXPECT_HAS(e.what(), "-DFSDP_WITH_CUDA=ON -DFSDP_WITH_NCCL=ON");
    }
  }
}

// --backend by name: each device's default, and a backend of the other device refused with the fix.
TEST(Rendezvous, ChooseBackend) {
  EXPECT_EQ(choose_backend("auto", false), "tcp");
  EXPECT_EQ(choose_backend("auto", true), "nccl");
  for (const char* b : {"tcp", "gloo"}) EXPECT_EQ(choose_backend(b, false), b);
  for (const char* b : {"nccl", "c10d-nccl"}) EXPECT_EQ(choose_backend(b, true), b);
  try {
    choose_backend("gloo", true);
    ADD_FAILURE() << "gloo on cuda";
  } catch (const UsageError& e) {
    EXPECT_HAS(e.what(), "InitOptions::backend gloo runs on the CPU but the job's device is cuda — use nccl or c10d-nccl");
  }
  try {
    choose_backend("mpi", false);
    ADD_FAILURE() << "mpi";
  } catch (const UsageError& e) {
    EXPECT_HAS(e.what(), "unknown InitOptions::backend 'mpi' — use tcp or gloo (CPU), nccl or c10d-nccl (CUDA)");
  }
}

// Kubeflow style: rank 0 hosts the TCPStore server, rank 1 connects. Two
// threads of this process play the two ranks.
TEST(Rendezvous, PlainEnvRankZeroHostsTheStore) {
  const std::string port = std::to_string(free_port());
  std::vector<at::Tensor> results(2);
  std::vector<std::string> errors(2);
  auto rank_main = [&](int r) {
    try {
      const WorldInfo w = detect({{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port},
                                  {"RANK", std::to_string(r)}, {"WORLD_SIZE", "2"}});
      InitOptions o;
      o.timeout = std::chrono::seconds(30);
      o.store_timeout = std::chrono::seconds(30);
      Runtime rt = init_process_group(w, o);
      auto t = at::full({3}, static_cast<float>(r + 1));
      rt.world_group->all_reduce(t, ReduceOp::kSum)->wait();
      results[r] = t;
      rt.world_group->barrier(std::chrono::seconds(30));
    } catch (const std::exception& e) {
      errors[r] = e.what();
    }
  };
  std::thread t0(rank_main, 0), t1(rank_main, 1);
  t0.join();
  t1.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    EXPECT_TRUE(results[r].equal(at::full({3}, 3.0f)));
  }
}

// A process started with WORLD_SIZE=3 joins a 2-rank job (rank 0 hosts the
// store): both fail while joining with a usage error naming both sizes,
// instead of hanging or asserting.
TEST(Rendezvous, WorldSizeMismatchIsAnErrorOnBothRanks) {
  const std::string port = std::to_string(free_port());
  std::vector<std::string> errors(2);
  auto rank_main = [&](int r) {
    try {
      const WorldInfo w = detect({{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port},
                                  {"RANK", std::to_string(r)}, {"WORLD_SIZE", r == 0 ? "2" : "3"}});
      InitOptions o;
      o.timeout = std::chrono::seconds(30);
      o.store_timeout = std::chrono::seconds(30);
      init_process_group(w, o);
      ADD_FAILURE() << "rank " << r << " connected despite the mismatch";
    } catch (const UsageError& e) {
      errors[r] = e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << ": not a usage error: " << e.what();
    }
  };
  std::thread t0(rank_main, 0), t1(rank_main, 1);
  t0.join();
  t1.join();
  // Whichever joined first set the job's size; the other fails on it and its
  // note fails the first one too.
  for (int r = 0; r < 2; ++r) {
    EXPECT_HAS(errors[r], "WORLD_SIZE mismatch: a process started as rank ");
    EXPECT_HAS(errors[r], "WORLD_SIZE=3");
    EXPECT_HAS(errors[r], "WORLD_SIZE=2");
    EXPECT_HAS(errors[r], "start every process of a job with the same WORLD_SIZE");
  }
}

TEST(Rendezvous, UnreachableStoreFailsClearly) {
  WorldInfo w = detect({{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(free_port())},
                        {"RANK", "1"}, {"WORLD_SIZE", "2"}});
  InitOptions o;
  o.store_timeout = std::chrono::milliseconds(1500);
  try {
    init_process_group(w, o);
    ADD_FAILURE() << "connected to nothing";
  } catch (const Failure& e) {
    // One deadline for the whole join (issue 39): said with the timeout it was given.
    EXPECT_HAS(e.what(), "nothing listens at MASTER_ADDR:MASTER_PORT = 127.0.0.1:");
    EXPECT_HAS(e.what(), "within 1.5 s");
    EXPECT_HAS(e.what(), "[rank 1/2]");
  }
}

TEST(Rendezvous, ParseTimeout) {
  EXPECT_EQ(parse_timeout("30", "--timeout"), std::chrono::seconds(30));
  EXPECT_EQ(parse_timeout("2.5", "--timeout"), std::chrono::milliseconds(2500));
  EXPECT_EQ(parse_timeout("0.0001", "--timeout"), std::chrono::milliseconds(1));  // rounded up, never 0
  EXPECT_EQ(parse_timeout("604800", "FSDP_TIMEOUT"), std::chrono::hours(24 * 7));
  for (const char* bad : {"", "abc", "10s", "0", "-1", "inf", "nan", "1e400", "604801", "1e19"}) {
    try {
      parse_timeout(bad, "FSDP_TIMEOUT");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const UsageError& e) {
      EXPECT_HAS(e.what(), "FSDP_TIMEOUT");
      EXPECT_HAS(e.what(), "e.g. FSDP_TIMEOUT=300");
    }
  }
  try {  // an option, not a variable: given as NAME 300
    parse_timeout("abc", "InitOptions::timeout");
    ADD_FAILURE() << "accepted 'abc'";
  } catch (const UsageError& e) {
    EXPECT_HAS(e.what(), "e.g. InitOptions::timeout 300");
  }
}

// Issue 16: a rank that never starts. Rank 0 names it when the (user's)
// timeout runs out.
TEST(Rendezvous, MissingRankIsNamedWhenTheTimeoutRunsOut) {
  const WorldInfo w = detect({{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(free_port())},
                              {"RANK", "0"}, {"WORLD_SIZE", "3"}});
  InitOptions o;
  o.store_timeout = std::chrono::milliseconds(1500);
  try {
    init_process_group(w, o);  // the collective timeout (10 min) must not matter
    ADD_FAILURE() << "joined without ranks 1 and 2";
  } catch (const UsageError& e) {
    ADD_FAILURE() << "not a usage error: " << e.what();
  } catch (const Failure& e) {
    EXPECT_HAS(e.what(), "[rank 0/3] ranks 1, 2 did not join the job at 127.0.0.1:");
    EXPECT_HAS(e.what(), "within 1.5 s (InitOptions::store_timeout)");
  }
}

// Issue 16: a third process with WORLD_SIZE=3 joins a running job of
// WORLD_SIZE=2. It used to die on an assertion (gloo) or a refused
// connection; now it names both sizes.
TEST(Rendezvous, ProcessJoiningWithAnotherWorldSizeNamesBoth) {
  const std::string port = std::to_string(free_port());
  auto env = [&](int rank, int world) {
    return detect({{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}, {"RANK", std::to_string(rank)},
                   {"WORLD_SIZE", std::to_string(world)}});
  };
  InitOptions o;
  o.timeout = std::chrono::seconds(30);
  o.store_timeout = std::chrono::seconds(30);
  std::vector<Runtime> job(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        job[r] = init_process_group(env(r, 2), o);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(errors, std::vector<std::string>(2)) << errors[0] << errors[1];
  try {
    init_process_group(env(2, 3), o);
    ADD_FAILURE() << "a WORLD_SIZE=3 process joined a WORLD_SIZE=2 job";
  } catch (const UsageError& e) {
    EXPECT_HAS(e.what(), "WORLD_SIZE mismatch: a process started as rank 2 with WORLD_SIZE=3 joined the job at "
                         "127.0.0.1:" + port + ", which has WORLD_SIZE=2");
  }
  // A second process claiming rank 1 of the same size is refused too.
  try {
    init_process_group(env(1, 2), o);
    ADD_FAILURE() << "rank 1 joined twice";
  } catch (const UsageError& e) {
    EXPECT_HAS(e.what(), "RANK=1 is taken twice in the job at 127.0.0.1:" + port);
  }
}

// Issue 16: an unresolvable MASTER_ADDR printed a warning every second until
// the store timeout. Now: one note, then a usage error naming MASTER_ADDR.
TEST(Rendezvous, UnresolvableMasterAddrIsOneNoteThenAnError) {
  const WorldInfo w = detect({{"MASTER_ADDR", "no-such-host.invalid"}, {"MASTER_PORT", "29500"},
                              {"RANK", "1"}, {"WORLD_SIZE", "2"}});
  InitOptions o;
  o.store_timeout = std::chrono::milliseconds(3500);
  ::testing::internal::CaptureStderr();
  try {
    init_process_group(w, o);
    ADD_FAILURE() << "connected to an unresolvable host";
  } catch (const Failure& e) {  // UsageError when the resolver says "no such name", Failure when it cannot tell
    EXPECT_HAS(e.what(), "MASTER_ADDR=no-such-host.invalid does not resolve");
    EXPECT_HAS(e.what(), "after trying for 3.5 s");
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  size_t lines = 0;
  for (char c : err) lines += c == '\n';
  EXPECT_EQ(lines, 1u) << err;
  EXPECT_HAS(err, "does not resolve yet");
}

}  // namespace
}  // namespace fsdp::comm
