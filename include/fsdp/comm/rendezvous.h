// Rendezvous: who am I in the job, where is the store, and the world group.
//
// detect_world() reads the launcher's environment; init_process_group() turns
// the result into a connected store and the "world" process group.
//
// Sources, first match wins:
//  1. torchrun / fsdp-train's launcher: any TORCHELASTIC_* variable is set.
//     RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
//     MASTER_PORT. With TORCHELASTIC_USE_AGENT_STORE=True the agent hosts the
//     TCPStore: every worker connects as a client (starting a server there
//     fails with "address in use"), keys under "/worker/fsdp" and the join's
//     generation: the store outlives worker groups that torchrun restarts, and
//     the agents' TORCHELASTIC_RESTART_COUNTs can differ after a lost node, so
//     the restart count does not separate them (Note [Join generations] in
//     rendezvous.cpp). FSDP_LAUNCHER names the launcher ("fsdp-train"), default
//     "torchrun".
//  2. Plain env (Kubeflow PyTorchJob, hand-rolled scripts): RANK and WORLD_SIZE,
//     MASTER_ADDR and MASTER_PORT when WORLD_SIZE > 1; optional LOCAL_RANK,
//     LOCAL_WORLD_SIZE (default 0 and 1: one process per pod), GROUP_RANK or
//     NODE_RANK. Rank 0 hosts the TCPStore server.
//  3. Slurm srun: SLURM_PROCID and SLURM_NTASKS. Local rank SLURM_LOCALID, node
//     SLURM_NODEID; local world size from SLURM_STEP_TASKS_PER_NODE, else
//     SLURM_NTASKS_PER_NODE, else SLURM_TASKS_PER_NODE (the entry for this node,
//     e.g. "2(x3),1"). Master: MASTER_ADDR if set, else the first host of
//     SLURM_STEP_NODELIST / SLURM_JOB_NODELIST / SLURM_NODELIST. Port:
//     MASTER_PORT if set, else slurm_default_port(SLURM_JOB_ID). Rank 0 hosts
//     the store.
//  4. None of these: a single process, rank 0 of 1, no network.
// Malformed or inconsistent values throw fsdp::UsageError naming the variables,
// their values and the fix.
#pragma once

#include "fsdp/comm/c10d.h"
#include "fsdp/comm/process_group.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::comm {

struct WorldInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        // rank among the processes on this node
  int local_world_size = 1;  // processes on this node
  int node_rank = 0;
  std::string master_addr;   // "" for a single process without a store
  int master_port = 0;
  bool agent_store = false;  // true: connect as a client even on rank 0
  std::string store_prefix;  // key prefix for every key this job uses ("" for none)
  std::string launcher = "single";  // "torchrun", "fsdp-train", "env", "slurm", "single"
  std::string socket_ifname;        // first entry of GLOO_SOCKET_IFNAME, or ""
  // FSDP_SHM: ranks on one host exchange through shared memory (default 1;
  // 0 keeps loopback TCP, e.g. to compare). TcpTransportOptions::shared_memory.
  bool shared_memory = true;
  // FSDP_JOIN_DEADLINE_MS: when the job's join ends at the latest, in
  // milliseconds of this host's steady (monotonic) clock; 0: none. fsdp-train's
  // launcher sets it from --timeout when it starts, so that the launcher's
  // wait for node 0 and the worker's rendezvous share one deadline (a worker
  // still gets at least 2 s to join, however late it started).
  int64_t join_deadline_ms = 0;
};

// Returns the variable's value, or nullopt when it is unset.
using GetEnv = std::function<std::optional<std::string>(const std::string&)>;

// Pure: reads only through `getenv`.
WorldInfo detect_world(const GetEnv& getenv);
// Reads the process environment.
WorldInfo detect_world();

// "node[01-03,7],gpu-a,x[1-2]-ib" -> node01 node02 node03 node7 gpu-a x1-ib x2-ib.
// Zero padding follows the range's lower bound; several bracket groups in one
// name expand as a cartesian product. `var` names the variable in errors.
std::vector<std::string> expand_slurm_nodelist(const std::string& list,
                                               const std::string& var = "SLURM_JOB_NODELIST");
// "2(x3),1" -> {2, 2, 2, 1}.
std::vector<int> expand_slurm_tasks_per_node(const std::string& spec,
                                             const std::string& var = "SLURM_TASKS_PER_NODE");
// Port used under Slurm when MASTER_PORT is unset: 15000 + job_id % 10000, so
// concurrent jobs on one node rarely collide (the scheme PyTorch Lightning uses).
int slurm_default_port(int64_t job_id);

// The longest --timeout / FSDP_TIMEOUT accepted: a week.
constexpr double kMaxTimeoutSeconds = 7 * 24 * 3600;

// Parses a timeout in seconds ("30", "2.5", "1e3") as given to --timeout or
// FSDP_TIMEOUT; `source` names it in errors ("InitOptions::timeout", "FSDP_TIMEOUT").
// Throws fsdp::UsageError unless it is a finite number in (0, kMaxTimeoutSeconds];
// rounds up to whole milliseconds.
std::chrono::milliseconds parse_timeout(const std::string& text, const std::string& source);

// The process groups by name (fsdp-train's --backend; docs/training.md):
//   "tcp"        our CPU group (backends.h: make_tcp_group), the CPU's default
//   "gloo"       PyTorch's c10d::ProcessGroupGloo (backends.h: make_gloo_group), CPU
//   "nccl"       our NCCL group (make_nccl_group), CUDA's default
//   "c10d-nccl"  PyTorch's c10d::ProcessGroupNCCL (make_torch_nccl_group), CUDA
//   "auto"       tcp on the CPU, nccl on CUDA
// Returns the backend a job on CUDA (`cuda`) or the CPU runs: `name`, or the
// device's default for "auto". Throws fsdp::UsageError naming `flag` for an
// unknown name, or one whose group takes tensors of the other device.
std::string choose_backend(const std::string& name, bool cuda, const std::string& flag = "InitOptions::backend");

struct InitOptions {
  // A name of choose_backend's ("auto": tcp; a CUDA job chooses with cuda = true).
  std::string backend = "auto";
  // The c10d backends' reductions (c10d.h); nullopt: the device's default
  // (rank order on the CPU, like the tcp group's). Ignored by tcp and nccl.
  std::optional<C10dReductions> reductions;
  // Default timeout of every collective on the world group and its sub-groups.
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
  // Resolving MASTER_ADDR, connecting to the store and waiting for every rank
  // to join.
  std::chrono::milliseconds store_timeout{std::chrono::minutes(5)};
  // What the user sets these with, named in timeout errors.
  std::string timeout_source = "InitOptions::store_timeout";
  // Settings every process of the job must give alike, as (flag, value), e.g.
  // {"--max-steps", "500"}: checked at the join like WORLD_SIZE (step 2 below).
  std::vector<std::pair<std::string, std::string>> agreed;
  // The CUDA device of nccl and c10d-nccl groups; nullopt: cuda:<local_rank>.
  // Several ranks may name the same GPU (Note [Several ranks on one GPU] in
  // src/comm/launcher.cpp).
  std::optional<int> cuda_device;
};

struct Runtime {
  WorldInfo world;
  // The job's store, already under world.store_prefix and the join's generation
  // (Note [Join generations] in rendezvous.cpp). Never null: an in-memory store
  // for a single process.
  c10::intrusive_ptr<c10d::Store> store;
  ProcessGroupPtr world_group;  // name "world"
  // A TCP group over the same ranks (name "cpu") for host-side agreement —
  // loss and stop flags, checkpoint coordination — when world_group runs on
  // NCCL (ours or c10d's) and takes CUDA tensors only. Null with tcp and
  // gloo: world_group (or a new_group of it) already takes CPU tensors.
  ProcessGroupPtr cpu_group;
};

// Connects (or, on rank 0 without an agent store, hosts) the TCPStore at
// master_addr:master_port, builds the world group and calls
// fsdp::set_rank_tag(rank, world_size). A world of size 1 without a master
// address uses no network. nccl and c10d-nccl use cuda:<local_rank> (or
// options.cuda_device) and also build cpu_group (TCP).
//
// Joining, in this order, all of it bounded by one deadline: options.store_timeout
// from the call, or world.join_deadline_ms when that comes first:
//  1. MASTER_ADDR must resolve. While it does not, one note goes to stderr and
//     resolution is retried quietly (a Kubernetes service name may appear
//     late); at the deadline: fsdp::UsageError naming MASTER_ADDR.
//  2. The store: nothing listening at MASTER_ADDR:MASTER_PORT by the deadline
//     is a fsdp::Failure naming them. Then every process records its
//     WORLD_SIZE, RANK and options.agreed there: the first one's WORLD_SIZE
//     and settings are the job's. A process with another WORLD_SIZE (under
//     fsdp-train's launcher: another --nnodes x --nproc-per-node) or setting,
//     or a RANK another process already took, fails with fsdp::UsageError
//     naming both values, and leaves a note in the store that makes every
//     process still joining fail with the same message.
//  3. Every rank must join: while some are missing, one note names them after
//     10 s; at the deadline fsdp::Failure names the ranks that never joined.
//     Under torchrun a RANK or WORLD_SIZE left in the store by workers that a
//     membership change killed starts a new generation of the join instead of
//     failing (Note [Join generations] in rendezvous.cpp).
// Only then are the groups' connections made (options.timeout).
Runtime init_process_group(const WorldInfo& world, const InitOptions& options = {});

}  // namespace fsdp::comm
