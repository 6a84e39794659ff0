// Collective bandwidth of the Gloo process group against c10d's ProcessGroupGloo,
// measured in the same run on the same store (DESIGN.md: benchmarks print ratios
// against a reference measured in the same run). Not part of the test suite.
//
//   bench_comm [--nproc N] [--iters K] [--mib a,b,c]
//
// Without RANK in the environment it launches itself N times (default 2) on
// 127.0.0.1 through comm::launch_local; rank 0 prints the table.
// GB/s is the full logical buffer (the all-gather output, the reduce-scatter
// input) divided by the time per call.
#include "fsdp/comm/launcher.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/comm/rendezvous.h"
#include "fsdp/common/error.h"
#include "fsdp/common/main.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
  int iters = 5;
  std::vector<int64_t> mib = {1, 16, 64};
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
    } else if (arg == "--mib") {
      a.mib.clear();
      size_t start = 0;
      while (start < v.size()) {
        const size_t comma = std::min(v.find(',', start), v.size());
        a.mib.push_back(std::stoll(v.substr(start, comma - start)));
        start = comma + 1;
      }
    } else {
      FSDP_CHECK(false, "bench_comm: unknown flag ", arg, " (use --nproc, --iters, --mib)");
    }
  }
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
  const int r = pg.rank();

  auto ref_store = c10::make_intrusive<c10d::PrefixStore>("bench/c10d", rt.store);
  auto ref_opts = c10d::ProcessGroupGloo::Options::create(std::chrono::minutes(5));
  ref_opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  ref_opts->threads = 2;
  c10d::ProcessGroupGloo ref(ref_store, r, w, ref_opts);

  if (r == 0) {
    std::printf("%d processes, fp32, %d iterations; GB/s of the full buffer (higher is better)\n", w,
                args.iters);
    std::printf("%-16s %8s %12s %12s %8s\n", "op", "MiB", "fsdp GB/s", "c10d GB/s", "ratio");
  }
  for (int64_t mib : args.mib) {
    const int64_t total = mib * (1 << 20) / 4 / w * w;  // elements, a multiple of w
    const int64_t n = total / w;
    const double gb = total * 4 / 1e9;
    at::Tensor full = at::randn({total});
    at::Tensor shard = at::randn({n});
    at::Tensor out_shard = at::empty({n});
    at::Tensor scratch = at::empty({total});

    const double ag = time_per_call(pg, args.iters, [&] { pg.all_gather(full, shard)->wait(); });
    std::vector<std::vector<at::Tensor>> ref_out(1);
    for (int q = 0; q < w; ++q) ref_out[0].push_back(full.narrow(0, q * n, n));
    std::vector<at::Tensor> ref_in{shard};
    const double ag_ref =
        time_per_call(pg, args.iters, [&] { ref.allgather(ref_out, ref_in)->wait(); });

    const double rs = time_per_call(pg, args.iters, [&] {
      pg.reduce_scatter(out_shard, full, ReduceOp::kSum)->wait();
    });
    // c10d 1.13 has no Gloo reduce_scatter: alltoall_base + local sum (what we do
    // through libgloo directly), and a full all_reduce (the naive substitute).
    std::vector<int64_t> counts;
    const double rs_ref = time_per_call(pg, args.iters, [&] {
      ref.alltoall_base(scratch, full, counts, counts)->wait();
      out_shard.copy_(scratch.narrow(0, 0, n));
      for (int q = 1; q < w; ++q) out_shard.add_(scratch.narrow(0, q * n, n));
    });
    std::vector<at::Tensor> ref_ar{scratch};
    const double ar_ref = time_per_call(pg, args.iters, [&] { ref.allreduce(ref_ar)->wait(); });
    const double ar = time_per_call(pg, args.iters, [&] { pg.all_reduce(scratch, ReduceOp::kSum)->wait(); });

    if (r == 0) {
      auto row = [&](const char* op, double ours, double theirs) {
        std::printf("%-16s %8lld %12.2f %12.2f %8.2f\n", op, static_cast<long long>(mib), gb / ours,
                    gb / theirs, theirs / ours);
      };
      row("all_gather", ag, ag_ref);
      row("reduce_scatter", rs, rs_ref);
      row("rs vs allreduce", rs, ar_ref);
      row("all_reduce", ar, ar_ref);
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
