// Local launcher: N worker processes on this host, supervised like torchrun.
// With nnodes > 1, one such launcher per node (Multi-node below).
//
// launch_local() hosts a c10d::TCPStore server on 127.0.0.1 (port chosen by the
// OS), starts `nproc` copies of `argv` with torchrun's environment
// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// GROUP_RANK, TORCHELASTIC_USE_AGENT_STORE=True, TORCHELASTIC_RESTART_COUNT=0,
// TORCHELASTIC_RUN_ID, FSDP_LAUNCHER) so workers take the same code path as
// under torchrun (rendezvous.h: agent store, client connection), and waits.
//
// Supervision. Each worker runs in its own process group; a worker exiting
// non-zero or dying from a signal stops the others (SIGTERM and SIGCONT, then
// SIGKILL after `kill_grace`). SIGINT/SIGTERM sent to the launcher are
// forwarded to the workers (with SIGCONT, so that a suspended worker can act
// on it), and the launcher keeps waiting for them (workers may checkpoint and
// exit 0) for at most `signal_timeout`, then stops them as above: the launcher
// returns at most signal_timeout + kill_grace after any signal, even when a
// worker is suspended (SIGSTOP). A second such signal kills them at once.
// When a worker exits, whatever it left in its process group is killed.
// Every child is reaped before launch_local returns or throws; workers die
// with the launcher (PR_SET_PDEATHSIG) if it is killed.
//
// Blame. When a rank fails, the launcher names the root cause, not the rank
// that noticed it: a rank found suspended at that moment (process state T:
// SIGSTOP, a debugger) is the failed rank, since the others time out waiting
// for it; otherwise the first rank reaped failing (a rank killed by a signal
// before one that exited in the same pass).
//
// Failure output. With `on_failure` set and no log_dir, the workers' stderr
// runs through the launcher: lines pass through at once, except a worker's
// fatal-error lines ("<program>: error: ..." / "<program>: failed: ...", what
// fsdp::run_main prints), which are held until that worker exits. When the
// job fails, on_failure(summary) runs before any held line is written, so the
// launcher's one-line summary is the first line of the failure on stderr,
// followed by the workers' own messages.
//
// Multi-node. With nnodes > 1 the launcher of node `node_rank` starts the
// ranks node_rank * nproc .. node_rank * nproc + nproc - 1 of nnodes * nproc
// (GROUP_RANK node_rank, LOCAL_WORLD_SIZE nproc). Node 0's launcher hosts the
// store on master_port (every interface); every worker connects to
// master_addr:master_port (the other launchers host nothing). Node 0 first
// checks that master_addr is an address of its own host (UsageError naming it
// otherwise: its workers and every other node would wait for a store that is
// not there). The nodes' world sizes (--nnodes x --nproc-per-node) are agreed
// when the workers join (rendezvous.h), both values named when they differ. Each launcher
// supervises only its own workers: a rank lost on another node shows up here
// as a local rank failing (the collective timeout names the missing ranks).
// RankOutcome::rank and the messages use global ranks.
//
// Threading: launch_local must be called from a thread that outlives the call
// (the workers' parent-death signal follows the thread that forked them), and
// only one launch_local may run at a time in a process when forward_signals
// is set (it installs process-wide SIGINT/SIGTERM handlers for the duration).
#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/comm/rendezvous.h"

namespace fsdp::comm {

struct LaunchOptions {
  // argv[0] is the program: a path, or a name looked up in PATH.
  std::vector<std::string> argv;
  int nproc = 1;
  // Processes per simulated node (LOCAL_WORLD_SIZE; LOCAL_RANK = rank % it,
  // GROUP_RANK = rank / it). 0: nproc (one node). Must divide nproc.
  int local_world_size = 0;
  // Added to (and overriding) the workers' environment, after the launcher's own variables.
  std::map<std::string, std::string> env;
  // Removed from the workers' environment (e.g. GTEST_OUTPUT).
  std::vector<std::string> unset_env;
  // "": workers share the launcher's stdout/stderr. Otherwise rank r's stdout
  // and stderr go to <log_dir>/rank<r>.log (the directory must exist).
  std::string log_dir;
  // 0: no limit. Otherwise every worker is stopped after this long.
  std::chrono::milliseconds timeout{0};
  // > 0: the whole join ends this long after launch_local starts (fsdp-train:
  // --timeout). With nnodes > 1 a launcher of node > 0 first waits, within
  // it, for node 0's store to accept connections (Failure naming
  // master_addr and master_port at the deadline; no worker is started);
  // then its workers get the deadline as FSDP_JOIN_DEADLINE_MS (rendezvous.h)
  // and join in what is left of it (at least 2 s). 0: each worker's own
  // store_timeout.
  std::chrono::milliseconds join_timeout{0};
  // Between SIGTERM and SIGKILL when stopping workers.
  std::chrono::milliseconds kill_grace{std::chrono::seconds(10)};
  // After the first SIGINT/SIGTERM forwarded to the workers: how long they may
  // take to exit on their own (finish a step, save a checkpoint) before they
  // are stopped. Must be positive.
  std::chrono::milliseconds signal_timeout{std::chrono::minutes(10)};
  // Called once, with the summary of the failure, when the first rank fails
  // (see Failure output above). Empty: nothing is called and workers' stderr
  // is not relayed.
  std::function<void(const std::string&)> on_failure;
  std::string run_id;  // TORCHELASTIC_RUN_ID; "" generates one (nnodes > 1: from master_addr:master_port)
  // Multi-node (see above): nnodes >= 1, 0 <= node_rank < nnodes; with nnodes > 1
  // master_addr must be set and 1 <= master_port <= 65535, and local_world_size
  // is nproc.
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr;
  int master_port = 0;
  bool forward_signals = true;
  // Every worker gets its own NCCL_HOSTID (<run id>-rank<r>; after a user's
  // NCCL_HOSTID, <theirs>-rank<r>), so that NCCL accepts several ranks on one
  // GPU (Note [Several ranks on one GPU] in launcher.cpp). Off: the workers
  // inherit the environment's, and NCCL refuses a second rank on a GPU.
  bool nccl_host_per_rank = false;
};

struct RankOutcome {
  int rank = 0;  // global rank (node_rank * nproc + local index)
  int pid = 0;
  bool signaled = false;  // died from a signal (then `signal`), else exited (`code`)
  int code = 0;
  int signal = 0;
  bool stopped = false;  // the launcher sent it SIGTERM/SIGKILL (another rank failed, timeout)
  bool suspended = false;  // found in process state T (SIGSTOP) when another rank failed
  std::string log_file;  // "" when not redirected
  // "exited with code 3", "was killed by signal 9 (Killed)".
  std::string describe() const;
};

struct LaunchResult {
  bool ok = false;        // every rank exited with code 0
  int exit_code = 0;      // see launch_exit_code
  // The root cause (see Blame above) as an index into `ranks` (its global rank
  // is ranks[failed_rank].rank; the same number on one node); -1 if none. A
  // suspended rank is blamed even though it was the launcher that ended it.
  int failed_rank = -1;
  bool timed_out = false;
  int signal_received = 0;  // SIGINT/SIGTERM forwarded to the workers, 0 if none
  // One line for the user: "rank 1 exited with code 3; stopped ranks 0, 2",
  // "rank 1 was suspended (process state T, e.g. SIGSTOP): the others waited
  // for it (rank 0 exited with code 1); stopped ranks 0, 1".
  std::string message;
  std::vector<RankOutcome> ranks;  // this launcher's workers, by local index
};

// Throws fsdp::UsageError for bad options (empty argv, program not found,
// nproc < 1, missing log_dir) before starting anything; fsdp::Failure if the
// store cannot be hosted or a worker cannot be started.
LaunchResult launch_local(const LaunchOptions& options);

// The launcher's own exit code: 0 when all ranks succeeded; otherwise the first
// failing rank's exit code, or 128 + signal if it died from one (1 when the
// failed rank was suspended); 124 when the
// timeout stopped the job; 128 + the forwarded signal if workers were
// interrupted without failing themselves.
int launch_exit_code(const LaunchResult& result);

// A program that launches itself, as fsdp-train's --nproc-per-node does:
//   const fsdp::comm::WorldInfo world = fsdp::comm::detect_world();
//   if (nproc > 1 && world.launcher == "single") {  // not started by a launcher: become one
//     fsdp::comm::LaunchOptions lo;
//     lo.nproc = nproc;
//     return fsdp::comm::launch_self("my-program", argc, argv, lo);
//   }
//   fsdp::comm::Runtime rt = fsdp::comm::init_process_group(world);  // a worker (or the only process)
// Runs options.nproc copies of this program (/proc/self/exe; argv[0] where that cannot be read)
// with argv[1..argc) under launch_local and waits for them. Unless options.on_failure is set, the
// failure's one-line summary goes to stderr as "<program>: <summary>" before the workers' error
// lines, and the final message (which rank failed, which were stopped) after them. options.argv is
// replaced. Returns launch_exit_code; throws as launch_local does.
int launch_self(const std::string& program, int argc, char** argv, LaunchOptions options);

// The first thing a training program does, under torchrun, Slurm, a PyTorchJob or on its own:
//   fsdp::comm::Job job = fsdp::comm::start_job("my-program", argc, argv, nproc_per_node, "cpu");
//   if (job.launched) return *job.launched;  // this process was the launcher: the workers are done
//   ... train with job.runtime on job.device ...
// Not started by a launcher (detect_world().launcher == "single") and nproc_per_node > 1: runs
// launch_self with options.nproc = nproc_per_node and returns its exit code in `launched`.
// Otherwise this process is a worker (or the only one): `device` "cpu" or "cuda" (anything else is a
// UsageError); "cuda" takes cuda:<local rank> (worker_device: UsageError without a CUDA build or device)
// and makes it current before any CUDA work. It joins with init.backend as choose_backend resolves it
// for the device ("auto": tcp on the CPU, nccl on CUDA; a backend of the other device is a UsageError).
// Then init_process_group(detect_world(), init). nproc_per_node is ignored under a launcher.
struct Job {
  std::optional<int> launched;  // set in the launcher process: the workers' exit code
  Runtime runtime;              // a worker's job (unset when launched)
  c10::Device device = c10::kCPU;  // where this worker computes
};
Job start_job(const std::string& program, int argc, char** argv, int nproc_per_node, const std::string& device,
              InitOptions init = {}, LaunchOptions options = {});

}  // namespace fsdp::comm
