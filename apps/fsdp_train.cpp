// fsdp-train: trains a Llama-family model with Fully Sharded Data Parallel.
//
// Modes: `fsdp-train [train] ...` trains; `fsdp-train eval ...` (or --eval-only)
// evaluates the starting weights; `fsdp-train convert --checkpoint-dir DIR
// --export-hf OUT` converts a checkpoint to Hugging Face files. The old
// spelling of a conversion, --max-steps 0 --resume, still works and says it is
// deprecated.
//
// Options: one row each in the option table (train_options_table.cpp), from
// which the command line, --help, the --config keys and --print-config come
// (docs/training.md, "Adding an option").
//
// Process model: with --nproc-per-node N (> 1) this process becomes a local
// launcher — it checks the flags, starts N workers (this same program and
// arguments) with torchrun's environment, supervises them and exits with the
// first failing worker's status. Under torchrun, Kubeflow PyTorchJob or Slurm
// srun every process is a worker already and --nproc-per-node is ignored.
// Several nodes without torchrun: the same command on each node with --nnodes
// N --node-rank i --master-addr <node 0's address> (node 0 hosts the store).
//
// Exit codes: 0 success, 2 bad usage (flags, files, shapes), 1 other failures.
// SIGTERM/SIGINT: every rank finishes its current step, a checkpoint is saved
// (with --checkpoint-dir) and the exit code is 0; without --checkpoint-dir the
// run stops after the step, nothing is saved, and the exit code is 128 + the
// signal (143 for SIGTERM) so that a supervisor does not take it for a finished
// run. Under torchrun, a rank stopped because another rank got the signal
// first waits up to 30 s for its own (Note [A peer's stop under torchrun]).
// A second signal kills the process at once. While the process is still
// joining the job (rendezvous), SIGTERM/SIGINT end it at once.
//
// Faults: --timeout SECONDS (or FSDP_TIMEOUT; the flag wins; default 600 s for
// collectives, 300 s for joining) bounds every wait on another rank. Joining:
// MASTER_ADDR resolving, the store answering, every rank showing up; ranks
// missing at the deadline are named. Collectives: a rank that does not reach
// one in time (suspended with SIGSTOP, hung, dead) is named by every surviving
// rank ("rank 1 did not reach all_reduce #5 ... within 30000 ms: stopped, hung
// or dead"), exit 1. The --nproc-per-node launcher blames that rank, not the
// one that noticed, prints its one-line summary before the workers' own error
// lines, and after a SIGTERM/SIGINT gives the workers --timeout to exit before
// stopping them (SIGTERM, then SIGKILL 10 s later).
#include <CLI/CLI.hpp>

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <set>
#include <sstream>
#include <thread>

#include "cli_numbers.h"
#include "option_names.h"
#include "config_flags.h"
#include "train_options_table.h"
#include "fsdp/checkpoint/peft.h"
#include "fsdp/comm/launcher.h"
#include "fsdp/comm/rendezvous.h"
#include "fsdp/common/internals.h"
#include "fsdp/common/device.h"
#include "fsdp/common/error.h"
#include "fsdp/common/main.h"
#include "fsdp/common/memory.h"
#include "fsdp/data/dataset.h"
#include "fsdp/train/model_family.h"
#include "fsdp/train/metrics.h"
#include "fsdp/train/prometheus.h"
#include "fsdp/train/trainer.h"

namespace {

using fsdp::kExitFailure;
using fsdp::kExitUsage;

// The one piece of process-wide mutable state in fsdp-train: the signal that
// asked this worker to stop (0: none), written by the handler, read once per
// step through TrainOptions::stop_requested.
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "signal handler needs lock-free atomics");

extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

// While joining the job nothing has been trained or saved, and the joining
// code waits inside the rendezvous store, not at a step boundary: a signal
// ends the process at once, with one line (write(2) and _exit are
// async-signal-safe) and the shell's 128 + signal.
extern "C" void on_signal_while_joining(int sig) {
  static const char kTerm[] = "fsdp-train: error: stopped by SIGTERM while joining the job (nothing trained or saved)\n";
  static const char kInt[] = "fsdp-train: error: stopped by SIGINT while joining the job (nothing trained or saved)\n";
  const char* text = sig == SIGTERM ? kTerm : kInt;
  const size_t n = sig == SIGTERM ? sizeof(kTerm) - 1 : sizeof(kInt) - 1;
  [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, text, n);
  ::_exit(128 + sig);
}

// `handler` for SIGTERM and SIGINT: on_signal_while_joining while joining, then
// on_stop_signal, which stops after the current step (preemption: Kubernetes,
// Slurm, torchrun's agent) with SA_RESETHAND: a second signal takes the
// default action (the process dies).
void handle_stop_signals(void (*handler)(int), int flags) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = flags;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

// Note [A peer's stop under torchrun]
// A stop is agreed at the end of a step (every rank saves the same checkpoint),
// so a rank can stop because ANOTHER rank received the signal. torchrun's agent
// takes its workers' exit 0 as "the job is finished". When a node joins an
// elastic job, every agent restarts its workers with SIGTERM, but not at the
// same moment: a worker that had already exited 0 by its peers' stop made its
// agent wait at the job's exit barrier while the others formed the new round
// without it (seen in Cluster.LoseANodeAndGetItBack.etcd). So under torchrun
// such a rank stays alive for up to kPeerStopWaitS after the save: its agent,
// checking every --monitor-interval (0.1 s by default), finds the joining node
// and restarts it, which signals it. If no signal comes, no node is joining:
// the stop was for the whole job (a Kubernetes pod's launcher signals its own
// workers only), and it exits 0 like the signalled ranks.
constexpr int kPeerStopWaitS = 30;

void await_own_stop_signal(const fsdp::comm::WorldInfo& world, int reason) {
  const char* name = reason == SIGINT ? "SIGINT" : "SIGTERM";
  std::cerr << "fsdp-train: rank " << world.rank << ": stopped with the job by a " << name
            << " another rank received; waiting up to " << kPeerStopWaitS
            << " s for torchrun's agent, which restarts this worker if a node is joining\n";
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(kPeerStopWaitS);
  while (g_stop_signal.load() == 0 && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (g_stop_signal.load() == 0) {
    std::cerr << "fsdp-train: rank " << world.rank << ": no signal from torchrun's agent in " << kPeerStopWaitS
              << " s: the job is stopped (the checkpoint is saved)\n";
  }
}

// The default corpus: built by scripts/prepare_data.sh, or the small one in
// the repository when it has not been built.
std::string embedded_corpus() {
  if (::access(FSDP_EMBEDDED_CORPUS, R_OK) == 0) return FSDP_EMBEDDED_CORPUS;
  return FSDP_FALLBACK_CORPUS;
}

// The validation split scripts/prepare_data.sh writes beside a corpus:
// corpus.jsonl -> corpus.val.jsonl.
std::string validation_split(const std::string& train) {
  const std::string ext = ".jsonl";
  if (train.size() > ext.size() && train.compare(train.size() - ext.size(), ext.size(), ext) == 0) {
    return train.substr(0, train.size() - ext.size()) + ".val.jsonl";
  }
  return train + ".val.jsonl";
}

// CPUs this process may run on (its affinity mask, as taskset and cgroups set it).
int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// --nproc-per-node's upper bound: one process per GPU with --device cuda; on
// the CPU, and with --device cuda:N (every rank on GPU N), 4 per core (each
// process holds LibTorch, its threads and its share of the model: more only
// thrash the machine).
constexpr int kProcessesPerCpu = 4;

void check_nproc(int nproc, const at::Device& device) {
  FSDP_CHECK(nproc >= 1, "--nproc-per-node must be >= 1, got ", nproc);
  if (nproc == 1) return;
  if (fsdp::ranks_share_one_gpu(device)) {
    fsdp::worker_device(device, /*local_rank=*/0);  // GPU N exists
  } else if (device.is_cuda()) {
    fsdp::worker_device("cuda", /*local_rank=*/0);  // a CUDA build with a GPU, else it says how to get one
    const int gpus = fsdp::cuda_device_count();
    FSDP_CHECK(nproc <= gpus, "--nproc-per-node ", nproc, " with --device cuda needs one GPU per process, but this "
               "machine shows ", gpus, " (CUDA_VISIBLE_DEVICES?) — use --nproc-per-node <= ", gpus,
               ", or --device cuda:0 to run every rank on one GPU (for tests: slow, over NCCL's sockets)");
    return;
  }
  const int cpus = usable_cpus();
  const int64_t limit = int64_t{kProcessesPerCpu} * cpus;
  FSDP_CHECK(nproc <= limit, "--nproc-per-node ", nproc, " is more processes than this machine can run: at most ",
             limit, " (", kProcessesPerCpu, " per CPU, ", cpus, " CPU", cpus == 1 ? "" : "s", " usable) with --device ",
             device.str(), " — use fewer processes, or several machines (torchrun, Slurm, Kubeflow)");
}

// --profile-steps A:B -> [A, B).
void parse_profile_steps(const std::string& text, fsdp::train::LogOptions& log) {
  const size_t colon = text.find(':');
  // The rule of every integer flag (cli_numbers.h): decimal digits within 64 bits.
  auto number = [&](std::string part) -> int64_t {
    FSDP_CHECK(fsdp::cli::strict_integer(part, /*is_unsigned=*/true).empty(), "--profile-steps '", text,
               "' is not A:B with whole numbers 0 <= A < B (e.g. 10:13 traces steps 10, 11 and 12)");
    return std::stoll(part);
  };
  FSDP_CHECK(colon != std::string::npos, "--profile-steps '", text,
             "' is not A:B with whole numbers 0 <= A < B (e.g. 10:13 traces steps 10, 11 and 12)");
  log.profile_begin = number(text.substr(0, colon));
  log.profile_end = number(text.substr(colon + 1));
  FSDP_CHECK(log.profile_begin < log.profile_end, "--profile-steps '", text, "': the end ", log.profile_end,
             " must be after the start ", log.profile_begin, " (A:B traces steps A..B-1)");
}

// The modes: training (no subcommand, or `train`), evaluation, conversion.
// Every option may follow the subcommand (fallthrough to this app's options).
struct Modes {
  CLI::App* train = nullptr;
  CLI::App* eval = nullptr;
  CLI::App* convert = nullptr;
};

Modes add_modes(CLI::App& app) {
  app.fallthrough();
  app.require_subcommand(0, 1);
  Modes m;
  m.train = app.add_subcommand("train", "Train (the default)");
  m.eval = app.add_subcommand(
      "eval", "Evaluate the weights of --init-from or --resume on all of --val-data, then export if asked "
              "(= --eval-only)");
  m.convert = app.add_subcommand(
      "convert", "Convert the newest checkpoint of --checkpoint-dir (ours, or a PyTorch distributed checkpoint) to "
                 "Hugging Face files (--export-hf), a distributed checkpoint (--export-dcp) or ours "
                 "(--export-checkpoint); no data needed; the model is the checkpoint's (or --model)");
  return m;
}

// The mode the command line asks for ("", "eval" or "convert"), set in t.o.mode;
// UsageError for two modes at once.
std::string decide_mode(const CLI::App& app, const Modes& m, fsdp::cli::TrainTargets& t) {
  fsdp::train::TrainOptions& o = t.o;
  const bool eval_only = t.run.eval_only;
  // --max-steps 0: the old spelling of a conversion.
  const bool deprecated_conversion = app.count("--max-steps") > 0 && o.step.max_steps == 0 &&
                                     m.convert->parsed() == false && m.eval->parsed() == false;
  FSDP_CHECK(!deprecated_conversion || o.checkpoint.resume, "--max-steps 0 (the deprecated spelling of 'fsdp-train "
             "convert') converts a checkpoint and needs --resume --checkpoint-dir DIR --export-hf OUT; give "
             "--max-steps >= 1 to train");
  FSDP_CHECK(!(m.convert->parsed() && eval_only), "'fsdp-train convert' and --eval-only are two modes; give one");
  FSDP_CHECK(!(m.train->parsed() && (eval_only || deprecated_conversion)), "'fsdp-train train' trains; leave out ",
             eval_only ? "--eval-only" : "--max-steps 0", " or use 'fsdp-train ", eval_only ? "eval" : "convert", "'");
  const std::string mode = m.convert->parsed() || deprecated_conversion ? "convert"
                           : m.eval->parsed() || eval_only               ? "eval"
                                                                         : "";
  o.mode = mode == "convert" ? fsdp::train::Mode::kConvert
           : mode == "eval"  ? fsdp::train::Mode::kEvaluate
                             : fsdp::train::Mode::kTrain;
  return mode;
}

// Types the words of the command line into t.o and the join's timeouts into `init`.
void apply_parsed(const CLI::App& app, const std::string& mode, fsdp::cli::TrainTargets& t,
                  fsdp::comm::InitOptions& init) {
  fsdp::train::TrainOptions& o = t.o;
  // The effective configuration: printed on request (once valid), recorded by every run beside its metrics.
  o.log.config_text = fsdp::cli::effective_config(app, mode);
  if (app.count("--config") > 0) o.log.config_file = t.run.config_file;
  if (!t.run.profile_steps.empty()) parse_profile_steps(t.run.profile_steps, o.log);
  o.log.user_terms = fsdp::cli::in_flag_terms;  // the log says flags where the library names fields
  // --init-adapter without --lora-alpha trains at the adapter's own alpha (the
  // trainer logs it); a different --lora-alpha is refused (models::check_adapter_alpha).
  if (o.lora.enabled() && !o.lora.init_adapter.empty() && o.lora.alpha == 0) {
    o.lora.alpha = fsdp::checkpoint::read_peft_adapter_config(o.lora.init_adapter).alpha;
  }
  if (o.data.path == "embedded") o.data.path = embedded_corpus();
  if (o.eval.val_data == "embedded") o.eval.val_data = validation_split(o.data.path);
  // --init-from DIR without --model: the model is DIR's config.json.
  if (!o.hf.init_from.empty() && app.count("--model") == 0) o.model = o.hf.init_from;
  // Converting a checkpoint without --model: the checkpoint's model (an empty
  // model spec; train/trainer.h).
  if (o.mode == fsdp::train::Mode::kConvert && app.count("--model") == 0) o.model.clear();
  init.backend = fsdp::comm::choose_backend(t.run.backend, o.device.is_cuda());
  if (o.device.has_index()) init.cuda_device = o.device.index();
  if (app.count("--timeout") > 0) {  // given: '' is refused too, not taken as "not given"
    init.timeout = init.store_timeout = fsdp::comm::parse_timeout(t.run.timeout, "--timeout");
  } else if (const char* env = std::getenv("FSDP_TIMEOUT"); env != nullptr && *env != '\0') {
    init.timeout = init.store_timeout = fsdp::comm::parse_timeout(env, "FSDP_TIMEOUT");
  }
  // Named in the join's errors and in its note on stderr while it waits, which no
  // in_flag_terms sees: the program's own words.
  init.timeout_source = "--timeout or FSDP_TIMEOUT";
}

// The launcher's own flags, checked by the process the user started.
void check_launcher_flags(const fsdp::cli::RunFlags& r) {
  FSDP_CHECK(r.nnodes >= 1 && r.nnodes <= 65536, "--nnodes must be in [1, 65536], got ", r.nnodes);
  FSDP_CHECK(r.node_rank >= 0 && r.node_rank < r.nnodes, "--node-rank ", r.node_rank, " must be in [0, --nnodes ",
             r.nnodes, ") — number the nodes 0..", r.nnodes - 1);
  FSDP_CHECK(r.nnodes == 1 || !r.master_addr.empty(), "--nnodes ", r.nnodes,
             " needs --master-addr: node 0's address as every node reaches it (and the same --master-port on all)");
  FSDP_CHECK(r.master_port >= 1 && r.master_port <= 65535, "--master-port must be in [1, 65535], got ",
             r.master_port);
}

// --nproc-per-node / --nnodes without torchrun: check once, start the workers, supervise them.
int launch_workers(int argc, char** argv, const fsdp::cli::TrainTargets& t, const fsdp::comm::InitOptions& init) {
  const fsdp::train::TrainOptions& o = t.o;
  const fsdp::cli::RunFlags& r = t.run;
  fsdp::train::validate_options(o, r.nproc * r.nnodes);  // fail once, before starting anything
  // The Prometheus ports the workers will listen on: free now, or an error before anything starts.
  if (o.log.metrics_port > 0 && o.mode != fsdp::train::Mode::kConvert) {
    for (int rank = 0; rank < (o.log.metrics_every_rank ? r.nproc : 1); ++rank) {
      fsdp::train::check_metrics_address(o.log.metrics_host, o.log.metrics_port + rank);
    }
  }
  // Every local worker's memory at once, before any of them allocates.
  fsdp::train::check_memory(fsdp::train::at_world_size(o, r.nproc * r.nnodes), r.nproc * r.nnodes, r.nproc,
                            std::nullopt);
  fsdp::comm::LaunchOptions lo;
  lo.nproc = r.nproc;
  lo.nnodes = r.nnodes;
  lo.node_rank = r.node_rank;
  lo.master_addr = r.master_addr;
  lo.master_port = r.master_port;
  lo.signal_timeout = init.timeout;
  lo.join_timeout = init.store_timeout;  // one deadline: this launcher's start to its workers' join
  // --device cuda:N: the local ranks share GPU N, which NCCL allows only to
  // ranks of different NCCL_HOSTID (Note [Several ranks on one GPU]).
  lo.nccl_host_per_rank = fsdp::ranks_share_one_gpu(o.device);
  return fsdp::comm::launch_self("fsdp-train", argc, argv, lo);
}

// This process is a worker: join the job and train (or evaluate, or convert).
int run_worker(fsdp::train::TrainOptions& o, const fsdp::comm::WorldInfo& world, fsdp::comm::InitOptions init) {
  if (o.device.is_cuda()) {
    // The NCCL groups on cuda:<local rank> (or --device cuda:N), made current before any CUDA work.
    fsdp::set_current_device(fsdp::worker_device(o.device, world.local_rank));
  }
  // Nodes started with different --max-steps would part mid-run (one finishes,
  // the other waits in a collective): agreed at the join, both values named.
  if (o.mode == fsdp::train::Mode::kTrain) init.agreed.emplace_back("--max-steps", std::to_string(o.step.max_steps));
  handle_stop_signals(on_signal_while_joining, 0);
  const fsdp::comm::Runtime rt = fsdp::comm::init_process_group(world, init);
  // Only now: a signal while joining must end the process, not wait for a step.
  handle_stop_signals(on_stop_signal, SA_RESETHAND);
  o.stop_requested = [] { return g_stop_signal.load(); };
  const fsdp::train::TrainSummary s = fsdp::train::train(o, rt);
  if (s.stop_reason == 0) return 0;
  if (o.checkpoint.dir.empty()) return 128 + s.stop_reason;  // stopped, nothing saved
  if (g_stop_signal.load() == 0 && world.launcher == "torchrun") await_own_stop_signal(world, s.stop_reason);
  return 0;
}

int run(int argc, char** argv) {
  fsdp::cli::TrainTargets t;  // the options' values, typed into t.o after parsing
  fsdp::train::TrainOptions& o = t.o;
  CLI::App app{"fsdp-train: train a Llama-family model with Fully Sharded Data Parallel (C++/LibTorch)."};
  app.get_formatter()->column_width(34);
  // A flag given twice takes its last value (scripts append overrides).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  fsdp::cli::register_train_options(app, t);  // apps/train_options_table.cpp
  const Modes modes = add_modes(app);
  fsdp::cli::strict_numbers(app);  // before --version: it is no number
  app.set_version_flag("--version", std::string("fsdp-train 0.1.0 (LibTorch ") + fsdp::internals::torch_version() + ")")
      ->configurable(false);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "fsdp-train: error: " << e.what() << " (see fsdp-train --help)\n";
    return kExitUsage;
  }
  if (app.count("--config") > 0) fsdp::cli::apply_config_file(app, t.run.config_file);
  if (t.run.list_metrics) {
    std::cout << fsdp::train::metrics_markdown();
    return 0;
  }
  if (t.run.list_options) {
    std::cout << fsdp::cli::train_options_json(app) << "\n";
    return 0;
  }
  const std::string mode = decide_mode(app, modes, t);
  fsdp::comm::InitOptions init;
  apply_parsed(app, mode, t, init);
  const int nproc = t.run.nproc, nnodes = t.run.nnodes;
  if (t.run.print_config) {
    // Never print a configuration that cannot run: the launcher's flags too (issue 50).
    check_nproc(nproc, o.device);
    check_launcher_flags(t.run);
    fsdp::train::validate_options(o, std::max(nproc, 1) * std::max(nnodes, 1));
    std::cout << o.log.config_text;
    return 0;
  }
  const fsdp::comm::WorldInfo world = fsdp::comm::detect_world();
  const bool is_worker = world.launcher != "single";
  // The deprecated --max-steps 0 conversion, said once: by the process the user started, not again by the
  // local launcher's workers.
  if (mode == "convert" && app.count("--max-steps") > 0 && !modes.convert->parsed() &&
      world.launcher != "fsdp-train" && world.rank == 0) {
    std::cerr << "fsdp-train: warning: --max-steps 0 to convert a checkpoint is deprecated; use 'fsdp-train convert "
                 "--checkpoint-dir DIR --export-hf OUT'\n";
  }
  if (!is_worker) check_nproc(nproc, o.device);  // under torchrun/srun/PyTorchJob the flag is ignored
  if (!is_worker) check_launcher_flags(t.run);
  if ((nproc > 1 || nnodes > 1) && !is_worker) return launch_workers(argc, argv, t, init);
  return run_worker(o, world, init);
}

}  // namespace

// The library's errors name its options; the user gave flags (option_names.h).
int main(int argc, char** argv) {
  return fsdp::run_main("fsdp-train", [&] { return fsdp::cli::with_flag_names([&] { return run(argc, argv); }); });
}
