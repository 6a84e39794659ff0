// Collective bandwidth of the CPU process group (our TCP transport, with shared
// memory between the ranks of one host unless FSDP_SHM=0), and of c10d's
// ProcessGroupGloo under the same ProcessGroup interface in the same processes
// (fsdp/comm/c10d.h: "gloo" with the adapter's rank-order sums, "gloo-native"
// with Gloo's own reduce_scatter and allreduce). Not part of the test suite.
// bench/comm/run.sh runs it beside PyTorch's own gloo backend from Python
// (bench/comm/torch_gloo.py, same sizes, same timing rule) and prints the ratios
// (docs/benchmarks.md: benchmarks print ratios against a reference measured in the same run).
//
//   bench_comm [--nproc N] [--iters K] [--mib a,b,c] [--c10d 0|1]
//
// Without RANK in the environment it launches itself N times (default 2) on
// 127.0.0.1 through comm::launch_local, as fsdp-train does; rank 0 prints one
// line per measurement:
//   RESULT <op> <MiB> <seconds per call> <GB/s>            (our group)
//   RESULT-<backend> <op> <MiB> <seconds per call> <GB/s>  (--c10d 1, the default: GLOO, GLOO-NATIVE)
// For each size the groups take turns, collective by collective, so that a
// drifting load hits all alike. GB/s is the full logical buffer (the all-gather output, the reduce-scatter
// input, the all-reduce tensor) over the time per call: one warm-up call, a
// barrier, then K calls each waited; the slowest rank's time.
#include "fsdp/comm/backends.h"
#include "fsdp/comm/launcher.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/comm/rendezvous.h"
#include "fsdp/common/error.h"
#include "fsdp/common/main.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using fsdp::comm::ProcessGroup;
using fsdp::comm::ReduceOp;

struct Args {
  int nproc = 2;
  int iters = 10;
  std::vector<int64_t> mib = {1, 16, 64};
  bool c10d = true;  // also measure c10d's ProcessGroupGloo through the adapter
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    FSDP_CHECK(i + 1 < argc, "bench_comm: ", arg, " needs a value");
    const std::string v = argv[++i];
    if (arg == "--nproc") {
      a.nproc = std::stoi(v);
    } else if (arg == "--iters") {
      a.iters = std::stoi(v);
    } else if (arg == "--c10d") {
      a.c10d = v != "0";
    } else if (arg == "--mib") {
      a.mib.clear();
      size_t start = 0;
      while (start < v.size()) {
        const size_t comma = std::min(v.find(',', start), v.size());
        a.mib.push_back(std::stoll(v.substr(start, comma - start)));
        start = comma + 1;
      }
    } else {
      FSDP_CHECK(false, "bench_comm: unknown flag ", arg, " (use --nproc, --iters, --mib, --c10d)");
    }
  }
  FSDP_CHECK(a.nproc >= 2 && a.iters >= 1 && !a.mib.empty(), "bench_comm: needs --nproc >= 2, --iters >= 1 and "
             "at least one --mib size, got --nproc ", a.nproc, " --iters ", a.iters);
  return a;
}

// Seconds per call of `fn` (iters calls after one warm-up), the slowest rank's.
double time_per_call(ProcessGroup& pg, int iters, const std::function<void()>& fn) {
  fn();
  pg.barrier(std::chrono::minutes(5));
  const auto start = Clock::now();
  for (int i = 0; i < iters; ++i) fn();
  const double local = std::chrono::duration<double>(Clock::now() - start).count() / iters;
  at::Tensor t = at::full({1}, local, at::kDouble);
  pg.all_reduce(t, ReduceOp::kMax)->wait();
  return t.item<double>();
}

int worker(const Args& args) {
  const fsdp::comm::WorldInfo world = fsdp::comm::detect_world();
  fsdp::comm::Runtime rt = fsdp::comm::init_process_group(world);
  ProcessGroup& pg = *rt.world_group;
  const int w = pg.size();
  // The groups measured, each with the label of its RESULT lines.
  std::vector<std::pair<std::string, fsdp::comm::ProcessGroupPtr>> groups = {{"RESULT", rt.world_group}};
  if (args.c10d) {
    fsdp::comm::TcpTransportOptions t;
    t.master_addr = world.master_addr;
    t.single_node = true;
    for (auto [label, reductions] : {std::pair{"RESULT-GLOO", fsdp::comm::C10dReductions::kRankOrder},
                                     std::pair{"RESULT-GLOO-NATIVE", fsdp::comm::C10dReductions::kBackend}}) {
      auto store = c10::make_intrusive<c10d::PrefixStore>(label, rt.store);
      groups.emplace_back(label, fsdp::comm::make_gloo_group(store, pg.rank(), w, label, pg.timeout(), t, reductions));
    }
  }
  if (pg.rank() == 0) {
    for (const auto& [label, g] : groups) {
      std::printf("bench_comm: %s: %s group (%s), %d processes, fp32, %d calls per size\n", label.c_str(),
                  g->backend().c_str(), g->transport().c_str(), w, args.iters);
    }
  }
  for (int64_t mib : args.mib) {
    const int64_t total = mib * (1 << 20) / 4 / w * w;  // elements, a multiple of w
    const int64_t n = total / w;
    const double gb = static_cast<double>(total) * 4 / 1e9;
    at::Tensor full = at::randn({total});
    at::Tensor shard = at::randn({n});
    at::Tensor out_shard = at::empty({n});
    at::Tensor reduced = at::randn({total});
    const char* const ops[] = {"all_gather", "reduce_scatter", "all_reduce"};
    std::vector<std::vector<double>> seconds(groups.size(), std::vector<double>(3));
    for (int op = 0; op < 3; ++op) {
      for (size_t g = 0; g < groups.size(); ++g) {
        ProcessGroup& group = *groups[g].second;
        seconds[g][static_cast<size_t>(op)] = time_per_call(pg, args.iters, [&] {
          if (op == 0) group.all_gather(full, shard)->wait();
          if (op == 1) group.reduce_scatter(out_shard, full, ReduceOp::kSum)->wait();
          if (op == 2) group.all_reduce(reduced, ReduceOp::kSum)->wait();
        });
      }
    }
    if (pg.rank() == 0) {
      for (size_t g = 0; g < groups.size(); ++g) {
        for (int op = 0; op < 3; ++op) {
          const double s = seconds[g][static_cast<size_t>(op)];
          std::printf("%s %s %lld %.6f %.3f\n", groups[g].first.c_str(), ops[op], static_cast<long long>(mib), s,
                      gb / s);
        }
      }
      std::fflush(stdout);
    }
  }
  pg.barrier(std::chrono::minutes(5));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return fsdp::run_main("bench_comm", [&] {
    const Args args = parse(argc, argv);
    if (std::getenv("RANK") != nullptr) return worker(args);
    fsdp::comm::LaunchOptions o;
    o.argv.assign(argv, argv + argc);
    o.argv[0] = std::filesystem::read_symlink("/proc/self/exe").string();
    o.nproc = args.nproc;
    const fsdp::comm::LaunchResult result = fsdp::comm::launch_local(o);
    if (!result.ok) std::fprintf(stderr, "bench_comm: %s\n", result.message.c_str());
    return result.exit_code;
  });
}
