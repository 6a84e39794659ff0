// Test support: the multi-process harness (multiproc.h).
#include "support/multiproc.h"

#include "fsdp/comm/launcher.h"
#include "fsdp/comm/rendezvous.h"
#include "fsdp/common/device.h"
#include "fsdp/common/error.h"

#include <execinfo.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

namespace fsdp::testing {
namespace {

namespace fs = std::filesystem;

constexpr const char* kWorkerVar = "FSDP_TEST_WORKER";
constexpr const char* kCallVar = "FSDP_TEST_CALL";
constexpr const char* kTempRootVar = "FSDP_TEST_TEMP_ROOT";
constexpr const char* kCollectiveTimeoutVar = "FSDP_TEST_COLLECTIVE_TIMEOUT_MS";
constexpr int kDefaultCollectiveTimeoutMs = 60000;

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

// This process's harness bookkeeping (test support only; the library has no
// such state). Function-local static: constructed on first use, destroyed at exit.
struct Harness {
  std::mutex mu;
  int next_call = 0;  // run_distributed calls so far in the running test
  std::string temp_root;                // parent: created on first use, removed at exit
  std::map<std::string, int> temp_uses;  // tag -> temp_dir calls so far in the running test

  ~Harness() {
    if (!temp_root.empty() && !is_worker()) {
      std::error_code ec;
      fs::remove_all(temp_root, ec);
    }
  }
};

// Restarts the per-test counters whenever a test starts (also across
// --gtest_repeat, where the same test runs again and its workers count from 0).
class ResetPerTest : public ::testing::EmptyTestEventListener {
 public:
  explicit ResetPerTest(Harness* h) : h_(h) {}
  void OnTestStart(const ::testing::TestInfo&) override {
    std::lock_guard<std::mutex> lock(h_->mu);
    h_->next_call = 0;
    h_->temp_uses.clear();
  }

 private:
  Harness* h_;
};

Harness& harness() {
  static Harness h;
  static const bool registered = [] {
    // gtest owns the listener; it outlives every test.
    ::testing::UnitTest::GetInstance()->listeners().Append(new ResetPerTest(&h));
    return true;
  }();
  (void)registered;
  return h;
}

std::string current_test_name() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  if (info == nullptr) return "";
  return std::string(info->test_suite_name()) + "." + info->name();
}

// Without FSDP_TEST_TMPDIR: the build tree's test-tmp, found from where the
// executable is (<build>/tests/<area>/<test>), never compiled in, so that a
// test executable copied elsewhere (the GPU pack) carries no path of the
// machine that built it; elsewhere than in a build tree, $TMPDIR/fsdp-test-tmp.
std::string default_temp_base() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path build = exe.parent_path().parent_path().parent_path();
    if (exe.parent_path().parent_path().filename() == "tests" && fs::exists(build / "CMakeCache.txt", ec)) {
      return (build / "test-tmp").string();
    }
  }
  return (fs::path(env_or("TMPDIR", "/tmp")) / "fsdp-test-tmp").string();
}

// Requires harness().mu held.
const std::string& temp_root_locked() {
  Harness& h = harness();
  if (!h.temp_root.empty()) return h.temp_root;
  if (is_worker()) {
    h.temp_root = env_or(kTempRootVar, "");
    FSDP_CHECK(!h.temp_root.empty(), "test worker started without ", kTempRootVar,
               " — workers are started by run_distributed");
    return h.temp_root;
  }
  const fs::path base = env_or("FSDP_TEST_TMPDIR", default_temp_base());
  fs::create_directories(base);
  std::string pattern = (base / "run-XXXXXX").string();
  FSDP_CHECK(mkdtemp(pattern.data()) != nullptr, "cannot create a temp dir under ", base.string(),
             ": ", std::strerror(errno), " — set FSDP_TEST_TMPDIR to a writable directory");
  h.temp_root = pattern;
  return h.temp_root;
}

std::string sanitize(const std::string& s) {
  std::string out;
  for (char c : s) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-') ? c : '_';
  return out;
}

std::string self_exe() {
  std::error_code ec;
  const auto p = fs::read_symlink("/proc/self/exe", ec);
  FSDP_CHECK(!ec, "cannot read /proc/self/exe: ", ec.message());
  return p.string();
}

// A worker that crashes prints a backtrace into its log before dying from the
// signal, so the parent's failure report shows where.
char g_crash_banner[128];  // written once before the handler is installed

extern "C" void on_crash(int sig) {
  (void)!write(STDERR_FILENO, g_crash_banner, std::strlen(g_crash_banner));
  void* frames[64];
  const int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  signal(sig, SIG_DFL);
  raise(sig);
}

void install_crash_handler(int rank) {
  std::snprintf(g_crash_banner, sizeof(g_crash_banner),
                "\n*** test worker rank %d: fatal signal; backtrace:\n", rank);
  struct sigaction sa {};
  sa.sa_handler = on_crash;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;
  for (int sig : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL}) sigaction(sig, &sa, nullptr);
}

void run_worker(int world_size, const std::function<void(comm::ProcessGroup&)>& body) {
  comm::WorldInfo world;
  try {
    world = comm::detect_world();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "test worker: bad environment: " << e.what();
    return;
  }
  if (world.world_size != world_size) {
    ADD_FAILURE() << "test worker: WORLD_SIZE=" << world.world_size
                  << " but run_distributed asked for " << world_size;
    return;
  }
  install_crash_handler(world.rank);
  comm::InitOptions options;
  options.timeout = std::chrono::milliseconds(
      std::atoi(env_or(kCollectiveTimeoutVar, std::to_string(kDefaultCollectiveTimeoutMs)).c_str()));
  options.store_timeout = std::chrono::milliseconds(kDefaultCollectiveTimeoutMs);
  const std::string backend = env_or("FSDP_TEST_BACKEND", "tcp");  // see multiproc.h
  options.backend = backend == "gloo-native" ? "gloo" : backend;
  if (backend == "gloo-native") options.reductions = comm::C10dReductions::kBackend;
  const std::string gpu = env_or("FSDP_TEST_CUDA_DEVICE", "");
  try {
    if (!gpu.empty() && (backend == "nccl" || backend == "c10d-nccl")) {
      options.cuda_device = std::stoi(gpu);
      set_current_device(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(*options.cuda_device)));
    }
    comm::Runtime rt = comm::init_process_group(world, options);
    body(*rt.world_group);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "rank " << world.rank << " of " << world_size
                  << ": exception escaped the run_distributed body: " << e.what();
  }
}

}  // namespace

bool is_worker() { return env_or(kWorkerVar, "") == "1"; }

std::string tail_file(const std::string& path, int max_lines) {
  std::ifstream in(path);
  if (!in) return "";
  std::deque<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
    if (static_cast<int>(lines.size()) > max_lines) lines.pop_front();
  }
  std::ostringstream os;
  for (const auto& l : lines) os << l << "\n";
  return os.str();
}

std::string temp_dir(const std::string& tag) {
  Harness& h = harness();
  std::lock_guard<std::mutex> lock(h.mu);
  const std::string test = current_test_name();
  const int n = h.temp_uses[tag]++;
  const fs::path dir =
      fs::path(temp_root_locked()) / sanitize(test.empty() ? "no-test" : test) / detail::cat(sanitize(tag), "-", n);
  if (!is_worker()) fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

void run_distributed(int world_size, const std::function<void(comm::ProcessGroup&)>& body,
                     std::chrono::seconds timeout, const std::map<std::string, std::string>& env) {
  FSDP_CHECK(world_size >= 1, "run_distributed: world_size ", world_size, " must be at least 1");
  const std::string test = current_test_name();
  FSDP_CHECK(!test.empty(), "run_distributed must be called from inside a gtest TEST");
  Harness& h = harness();
  int call;
  std::string root;
  {
    std::lock_guard<std::mutex> lock(h.mu);
    call = h.next_call++;
    root = temp_root_locked();
  }

  if (is_worker()) {
    if (env_or(kCallVar, "") == std::to_string(call)) run_worker(world_size, body);
    return;
  }

  comm::LaunchOptions o;
  o.argv = {self_exe(), "--gtest_filter=" + test, "--gtest_repeat=1", "--gtest_color=no"};
  if (test.find("DISABLED_") != std::string::npos) o.argv.push_back("--gtest_also_run_disabled_tests");
  o.nproc = world_size;
  o.env = env;
  const auto shared = env.find("FSDP_TEST_NCCL_HOSTID");
  o.nccl_host_per_rank =
      env.count("FSDP_TEST_CUDA_DEVICE") > 0 && (shared == env.end() || shared->second != "shared");
  o.env[kWorkerVar] = "1";
  o.env[kCallVar] = std::to_string(call);
  o.env[kTempRootVar] = root;
  o.unset_env = {"GTEST_OUTPUT", "GTEST_FILTER", "GTEST_REPEAT", "GTEST_SHUFFLE",
                 "GTEST_SHARD_INDEX", "GTEST_TOTAL_SHARDS", "GTEST_SHARD_STATUS_FILE",
                 "GTEST_BREAK_ON_FAILURE"};
  const fs::path logs = fs::path(root) / sanitize(test) / detail::cat("run", call, "-w", world_size, "-logs");
  fs::remove_all(logs);
  fs::create_directories(logs);
  o.log_dir = logs.string();
  o.timeout = timeout;
  o.kill_grace = std::chrono::seconds(5);
  o.forward_signals = false;  // Ctrl-C kills the test; workers die with it (parent-death signal)

  const comm::LaunchResult r = comm::launch_local(o);
  if (r.ok) {
    // FSDP_TEST_VERBOSE=1: show what rank 0 printed (measurements, [parity] lines).
    const char* verbose = std::getenv("FSDP_TEST_VERBOSE");
    if (verbose != nullptr && std::string(verbose) == "1" && !r.ranks.empty()) {
      std::cout << "----- rank 0 of run_distributed(world_size=" << world_size << ", call " << call << ") -----\n"
                << tail_file(r.ranks[0].log_file, 400) << std::flush;
    }
    return;
  }
  std::ostringstream os;
  os << "run_distributed(world_size=" << world_size << ", call " << call << ") failed: " << r.message
     << "\n";
  bool printed = false;
  for (const auto& rank : r.ranks) {
    const bool failed = rank.signaled || rank.code != 0;
    const bool hung = r.timed_out && rank.stopped;
    if (!(failed && !rank.stopped) && !hung && rank.rank != r.failed_rank) continue;
    os << "----- rank " << rank.rank << " " << rank.describe() << (hung ? " (hung)" : "")
       << "; last lines of " << rank.log_file << " -----\n"
       << tail_file(rank.log_file, 100);
    printed = true;
  }
  if (!printed) {
    for (const auto& rank : r.ranks) {
      os << "----- rank " << rank.rank << " " << rank.describe() << "; last lines of "
         << rank.log_file << " -----\n"
         << tail_file(rank.log_file, 100);
    }
  }
  ADD_FAILURE() << os.str();
}

}  // namespace fsdp::testing
