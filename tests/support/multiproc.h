// Multi-process test harness: run a test body as the ranks of a real world group (TCP unless asked).
//
//   TEST(Collectives, AllGather) {
//     for (int w : {1, 2, 3, 4}) {
//       fsdp::testing::run_distributed(w, [&](fsdp::comm::ProcessGroup& pg) {
//         ... EXPECT_* on this rank's results ...
//       });
//     }
//   }
//
// The parent process (ctest runs the test binary once per TEST) re-executes the
// binary `world_size` times with --gtest_filter=<this test>, through
// comm::launch_local, so workers rendezvous exactly as under torchrun (agent
// store on 127.0.0.1). In a worker, the whole TEST runs again, but only the
// run_distributed call with the parent's call index runs its body; every other
// call returns at once. Code outside the body therefore runs in the parent and in
// every worker: keep it deterministic (same seeds, same temp_dir calls).
//
// Worker environment: FSDP_TEST_WORKER=1, FSDP_TEST_CALL=<call index>,
// FSDP_TEST_TEMP_ROOT, plus `env` (LOCAL_WORLD_SIZE=k simulates nodes of k
// ranks: LOCAL_RANK and GROUP_RANK follow). A worker's collective timeout is
// FSDP_TEST_COLLECTIVE_TIMEOUT_MS (default 60000) so a bug fails fast. The
// world group's backend is FSDP_TEST_BACKEND of `env`: tcp (the default), gloo
// (c10d's ProcessGroupGloo, rank-order reductions), gloo-native (its own
// reductions), nccl or c10d-nccl (CUDA: each rank on cuda:<local rank>).
// FSDP_TEST_CUDA_DEVICE=N in `env` puts every rank's NCCL groups on GPU N,
// each rank with its own NCCL_HOSTID (Note [Several ranks on one GPU] in
// src/comm/launcher.cpp); FSDP_TEST_NCCL_HOSTID=shared besides keeps the
// environment's one NCCL_HOSTID for all ranks (NCCL then refuses the group).
// FSDP_TEST_VERBOSE=1 in the parent prints rank 0's output of successful runs.
#pragma once

#include "fsdp/comm/process_group.h"

#include <chrono>
#include <functional>
#include <map>
#include <string>

namespace fsdp::testing {

// True in a re-executed worker process.
bool is_worker();

// Parent: re-executes this test binary `world_size` times running only the
// current gtest test, as ranks of one TCP world group on 127.0.0.1, waits up
// to `timeout`, and records a gtest failure that prints every failed rank's
// captured output (last ~100 lines each) if any rank fails, crashes or hangs.
// Worker: runs body(world_group) for the matching call only, then lets gtest
// finish so assertion failures give a non-zero exit. An exception escaping
// `body` is recorded as a failure of that rank. `env` is added to the workers'
// environment. Must be called from inside a TEST.
void run_distributed(int world_size, const std::function<void(comm::ProcessGroup&)>& body,
                     std::chrono::seconds timeout = std::chrono::seconds(180),
                     const std::map<std::string, std::string>& env = {});

// A fresh empty directory under the temp area ($FSDP_TEST_TMPDIR, else
// <build>/test-tmp for a test executable in a build tree, else
// $TMPDIR/fsdp-test-tmp), removed at process exit (parent only). The path depends
// only on the running test, `tag` and how many times this test asked for `tag`,
// so the parent and every worker get the same directory for the same call
// (workers create it if needed and never remove it).
std::string temp_dir(const std::string& tag);

// The last `max_lines` lines of a text file ("" if it cannot be read).
std::string tail_file(const std::string& path, int max_lines = 100);

}  // namespace fsdp::testing
