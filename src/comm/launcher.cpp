#include "fsdp/comm/launcher.h"

#include "fsdp/common/device.h"
#include "fsdp/common/error.h"
#include "fsdp/common/files.h"
#include "fsdp/common/output_file.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <memory>
#include <sstream>
#include <thread>

extern char** environ;

namespace fsdp::comm {

std::string RankOutcome::describe() const {
  if (signaled) {
    const char* name = strsignal(signal);
    return detail::cat("was killed by signal ", signal, " (", name ? name : "unknown", ")");
  }
  return detail::cat("exited with code ", code);
}

int launch_exit_code(const LaunchResult& r) {
  if (r.ok) return 0;
  if (r.timed_out) return 124;
  auto code_of = [](const RankOutcome& o) { return o.signaled ? 128 + o.signal : o.code; };
  if (r.failed_rank >= 0) {
    const RankOutcome& f = r.ranks[static_cast<size_t>(r.failed_rank)];
    return f.suspended ? 1 : code_of(f);  // the launcher ended it: its own status says nothing
  }
  for (const auto& o : r.ranks) {
    if (!o.signaled && o.code != 0) return o.code;
  }
  if (r.signal_received != 0) {
    for (const auto& o : r.ranks) {
      if (o.signaled) return 128 + r.signal_received;
    }
    return 0;
  }
  return 1;
}

namespace {

using Clock = std::chrono::steady_clock;

// The one piece of process-wide mutable state in comm/: a signal handler can
// only talk to the supervision loop through a lock-free global. Written only by
// on_signal, read by launch_local.
std::atomic<int> g_signal_count{0};
std::atomic<int> g_last_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "signal handler needs lock-free atomics");

extern "C" void on_signal(int sig) {
  g_last_signal.store(sig);
  g_signal_count.fetch_add(1);
}

// Installs SIGINT/SIGTERM handlers for its lifetime, restoring the previous ones.
class SignalForwarding {
 public:
  explicit SignalForwarding(bool enable) : enabled_(enable) {
    if (!enabled_) return;
    g_signal_count.store(0);
    g_last_signal.store(0);
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~SignalForwarding() {
    if (!enabled_) return;
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  SignalForwarding(const SignalForwarding&) = delete;
  SignalForwarding& operator=(const SignalForwarding&) = delete;

 private:
  bool enabled_;
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

std::string resolve_program(const std::string& prog) {
  FSDP_CHECK(!prog.empty(), "launch_local: the program (argv[0]) is empty");
  if (prog.find('/') != std::string::npos) {
    FSDP_CHECK(access(prog.c_str(), X_OK) == 0, "launch_local: '", prog,
               "' is not an executable file (", std::strerror(errno), ")");
    return prog;
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t colon = std::min(dirs.find(':', start), dirs.size());
    std::string dir = dirs.substr(start, colon - start);
    if (dir.empty()) dir = ".";
    const std::string candidate = dir + "/" + prog;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    start = colon + 1;
  }
  FSDP_CHECK(false, "launch_local: program '", prog, "' not found in PATH=", dirs,
             " — pass a path or fix PATH");
  return {};
}

// A port the OS considers free right now (fallback if the store cannot report
// the port it bound).
int probe_free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  FSDP_CHECK(fd >= 0, "launch_local: socket() failed: ", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  if (!ok) FSDP_FAIL("launch_local: cannot find a free port on 127.0.0.1: ", std::strerror(errno));
  return ntohs(addr.sin_port);
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::ostringstream os;
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  return os.str();
}

// The workers; on destruction any still running are killed and all are reaped,
// so no path out of launch_local leaves a zombie or a stray process.
class Workers {
 public:
  explicit Workers(int n) : pids_(static_cast<size_t>(n), -1), running_(static_cast<size_t>(n), false) {}
  ~Workers() {
    for (size_t r = 0; r < pids_.size(); ++r) {
      if (!running_[r]) continue;
      kill(-pids_[r], SIGKILL);
      kill(pids_[r], SIGKILL);
      int status = 0;
      while (waitpid(pids_[r], &status, 0) < 0 && errno == EINTR) {
      }
    }
  }
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;

  void started(int r, pid_t pid) {
    pids_[static_cast<size_t>(r)] = pid;
    running_[static_cast<size_t>(r)] = true;
  }
  bool running(int r) const { return running_[static_cast<size_t>(r)]; }
  pid_t pid(int r) const { return pids_[static_cast<size_t>(r)]; }
  int size() const { return static_cast<int>(pids_.size()); }
  int count_running() const {
    int n = 0;
    for (bool b : running_) n += b ? 1 : 0;
    return n;
  }
  // Non-blocking reap of rank r. Kills what the worker left in its process group.
  bool try_reap(int r, int* status) {
    if (!running(r)) return false;
    const pid_t p = waitpid(pid(r), status, WNOHANG);
    if (p != pid(r)) return false;
    running_[static_cast<size_t>(r)] = false;
    kill(-pid(r), SIGKILL);  // leftovers in the worker's process group, if any
    return true;
  }
  // Also continues a suspended worker, which otherwise could act on `sig`
  // (a handler, or SIGTERM's default) only once someone sent it SIGCONT.
  void signal_all(int sig) {
    for (int r = 0; r < size(); ++r) {
      if (!running(r)) continue;
      kill(-pid(r), sig);
      if (sig != SIGKILL) kill(-pid(r), SIGCONT);
    }
  }
  // The worker's process state from /proc ('R', 'S', 'T' stopped, 't'
  // traced, ...), '?' if unknown.
  char state(int r) const {
    const std::string stat = read_system_file(detail::cat("/proc/", pid(r), "/stat"));
    const auto paren = stat.rfind(')');  // the command name may hold spaces and parentheses
    return paren != std::string::npos && stat.size() > paren + 2 ? stat[paren + 2] : '?';
  }

 private:
  std::vector<pid_t> pids_;
  std::vector<bool> running_;
};

struct ChildSpec {
  std::string program;
  std::vector<std::string> argv;
  std::vector<std::string> env;  // "K=V"
  int log_fd = -1;               // stdout and stderr; -1: inherit
  int err_fd = -1;               // stderr only (the relay's pipe); -1: inherit
};

// Note [Failure summary first]
// When a rank fails, the first stderr line the user reads should say which
// rank failed and why (the launcher's summary), not the error a surviving
// rank hit when its peer went away. A worker prints its fatal error
// (fsdp::run_main: "<program>: failed: ..." or "<program>: error: ...") just
// before it exits, so the launcher holds exactly those lines until the worker
// has been reaped: by then it knows whether the job failed and has printed
// its summary. Every other line passes through at once, so progress and
// warnings are not delayed; stdout is not touched.
class StderrRelay {
 public:
  explicit StderrRelay(int n) : pipes_(static_cast<size_t>(n)) {}
  ~StderrRelay() {
    for (auto& p : pipes_) {
      if (p.fd >= 0) ::close(p.fd);
    }
  }
  StderrRelay(const StderrRelay&) = delete;
  StderrRelay& operator=(const StderrRelay&) = delete;

  // A pipe for rank r's stderr; returns its write end, which the caller
  // closes once the worker holds it.
  int open_pipe(int r) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) FSDP_FAIL("launch_local: pipe failed: ", std::strerror(errno));
    fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    pipes_[static_cast<size_t>(r)].fd = fds[0];
    return fds[1];
  }
  // Passes on the complete lines rank r wrote so far, holding fatal ones.
  void pump(int r) {
    Pipe& p = pipes_[static_cast<size_t>(r)];
    if (p.fd < 0) return;
    char buf[4096];
    for (;;) {
      const ssize_t n = ::read(p.fd, buf, sizeof(buf));
      if (n > 0) {
        p.partial.append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      break;  // EAGAIN: nothing more now; 0: every writer closed
    }
    size_t start = 0;
    for (size_t nl; (nl = p.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
      line(p, p.partial.substr(start, nl + 1 - start));
    }
    p.partial.erase(0, start);
  }
  // After rank r exited: everything it wrote, a last unterminated line included.
  void drain(int r) {
    pump(r);
    Pipe& p = pipes_[static_cast<size_t>(r)];
    if (!p.partial.empty()) line(p, p.partial + "\n");
    p.partial.clear();
  }
  // Writes rank r's held lines.
  void release(int r) {
    for (const auto& l : pipes_[static_cast<size_t>(r)].held) emit(l);
    pipes_[static_cast<size_t>(r)].held.clear();
  }

 private:
  struct Pipe {
    int fd = -1;
    std::string partial;            // bytes after the last newline
    std::vector<std::string> held;  // fatal lines, until the worker exits
  };
  // "<program>: error: " or "<program>: failed: " at the start, with no space in <program>.
  static bool is_fatal(const std::string& l) {
    for (const char* tag : {": error: ", ": failed: "}) {
      const size_t at = l.find(tag);
      if (at != std::string::npos && at > 0 && l.find(' ') > at) return true;
    }
    return false;
  }
  void line(Pipe& p, const std::string& l) {
    if (is_fatal(l)) {
      p.held.push_back(l);
    } else {
      emit(l);
    }
  }
  static void emit(const std::string& l) {
    const char* d = l.data();
    size_t left = l.size();
    while (left > 0) {
      const ssize_t k = ::write(STDERR_FILENO, d, left);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) return;  // stderr is gone: nothing better to do with the line
      d += k;
      left -= static_cast<size_t>(k);
    }
  }
  std::vector<Pipe> pipes_;
};

// fork + exec. Between the two only async-signal-safe calls: everything the
// child needs is prepared here first.
pid_t spawn(const ChildSpec& spec, int max_fd) {
  std::vector<char*> argv;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t parent = getpid();
  static const char kExecFailed[] = "fsdp launcher: exec failed\n";

  // Signals stay blocked across fork until the child has restored default
  // handlers: a SIGTERM from the supervisor arriving before exec must not run
  // the launcher's inherited handler (and be lost) in the child.
  sigset_t all, old_mask;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old_mask);
  const pid_t pid = fork();
  if (pid != 0) pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  if (pid < 0) FSDP_FAIL("launch_local: fork failed: ", std::strerror(errno));
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the launcher died before prctl
    if (spec.log_fd >= 0) {
      dup2(spec.log_fd, STDOUT_FILENO);
      dup2(spec.log_fd, STDERR_FILENO);
    }
    if (spec.err_fd >= 0) dup2(spec.err_fd, STDERR_FILENO);
    if (syscall(SYS_close_range, 3U, ~0U, 0U) != 0) {
      for (int fd = 3; fd < max_fd; ++fd) close(fd);
    }
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (int sig : {SIGINT, SIGTERM, SIGPIPE, SIGQUIT, SIGHUP, SIGCHLD, SIGUSR1, SIGUSR2}) {
      sigaction(sig, &dfl, nullptr);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execve(spec.program.c_str(), argv.data(), envp.data());
    (void)!write(STDERR_FILENO, kExecFailed, sizeof(kExecFailed) - 1);
    _exit(127);
  }
  setpgid(pid, pid);  // also from the parent, so kill(-pid) works at once
  return pid;
}

// Node 0 hosts the store at master_addr: it must name this host (a name or
// address of one of its interfaces), else every worker waits for nothing.
// Binding a socket to an address succeeds only for the host's own addresses.
void check_master_addr_is_here(const std::string& addr) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(addr.c_str(), nullptr, &hints, &found);
  FSDP_CHECK(rc == 0, "LaunchOptions::master_addr ", addr, " does not resolve here on node 0 (",
             rc == EAI_SYSTEM ? std::strerror(errno) : gai_strerror(rc),
             "): node 0 hosts the rendezvous at LaunchOptions::master_addr — give node 0's own address as the other "
             "nodes reach it");
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> addresses(found, &freeaddrinfo);
  std::string listed;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = "?";
    const void* raw = a->ai_family == AF_INET6 ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(a->ai_addr)->sin6_addr)
                                               : static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr);
    inet_ntop(a->ai_family, raw, text, sizeof(text));
    const bool wildcard = a->ai_family == AF_INET6
                              ? IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(a->ai_addr)->sin6_addr)
                              : reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr.s_addr == htonl(INADDR_ANY);
    FSDP_CHECK(!wildcard, "LaunchOptions::master_addr ", addr, " is the wildcard address ", text, ", which no other "
               "node can reach; give node 0's own address");
    listed += (listed.empty() ? "" : ", ") + std::string(text);
    const int fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    const bool here = bind(fd, a->ai_addr, a->ai_addrlen) == 0 || errno == EADDRINUSE;  // port 0: any
    close(fd);
    if (here) return;
  }
  FSDP_CHECK(false, "LaunchOptions::master_addr ", addr, " (", listed, ") is not an address of this host, but this is "
             "node 0 (LaunchOptions::node_rank 0), which hosts the rendezvous there — give node 0's own address as "
             "the other nodes reach it (hostname -I lists them), or check LaunchOptions::node_rank");
}

// The launcher of a node other than 0 joins first: it waits, until the
// join's deadline, for node 0's store to accept connections, and only then
// starts its workers (with what is left of the deadline). Node 0 missing or
// listening elsewhere is then one message from the launcher within --timeout,
// not a wait per worker (issue 39).
void wait_for_store(const LaunchOptions& o, Clock::time_point deadline) {
  const std::string port = std::to_string(o.master_port);
  std::string why = "nothing accepted a connection";
  while (Clock::now() < deadline) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = getaddrinfo(o.master_addr.c_str(), port.c_str(), &hints, &found);
    if (rc != 0) {
      why = detail::cat("it does not resolve: ", rc == EAI_SYSTEM ? std::strerror(errno) : gai_strerror(rc));
    } else {
      std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> addresses(found, &freeaddrinfo);
      for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
        const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        timeval tv{0, 500000};
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));  // bounds connect() on Linux
        const bool up = connect(fd, a->ai_addr, a->ai_addrlen) == 0;
        close(fd);
        if (up) return;
      }
      why = "nothing accepted a connection";
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(std::chrono::milliseconds(100), deadline - Clock::now()));
  }
  std::ostringstream seconds;
  seconds << static_cast<double>(o.join_timeout.count()) / 1000 << " s";
  FSDP_FAIL("node ", o.node_rank, ": the rendezvous at LaunchOptions::master_addr ", o.master_addr,
            " LaunchOptions::master_port ", o.master_port, " did not answer within ", seconds.str(),
            " (LaunchOptions::join_timeout; ", why, "): node 0 (LaunchOptions::node_rank 0) has not started, has "
            "failed, or listens elsewhere — start it with the same LaunchOptions::master_addr and "
            "LaunchOptions::master_port");
}

// Note [Several ranks on one GPU]
// NCCL refuses a communicator in which two ranks hold the same GPU: it compares
// each rank's host hash and the GPU's bus id ("Duplicate GPU detected"). The
// host hash is read from NCCL_HOSTID when that is set (NCCL's own misc/utils),
// so processes with different NCCL_HOSTID on one GPU look like ranks on
// different hosts and form a real communicator over NCCL's network transport
// (sockets here) instead of shared memory or NVLink. That is no way to train
// fast, but it runs every collective, every sub-group and every failure path
// of a multi-rank job on the one GPU a test machine has. fsdp-train does it for
// --device cuda:N with more than one process (every rank on GPU N), the test
// harness for its NCCL runs; without it NCCL's refusal stands, and is tested.
std::vector<std::string> worker_env(const LaunchOptions& o, int rank, int lws, const std::string& master_addr,
                                    int port, const std::string& run_id, int64_t join_deadline_ms) {
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string kv = *e;
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& k : o.unset_env) env.erase(k);
  const int world = o.nproc * o.nnodes;
  env["MASTER_ADDR"] = master_addr;
  env["MASTER_PORT"] = std::to_string(port);
  env["RANK"] = std::to_string(rank);
  env["WORLD_SIZE"] = std::to_string(world);
  env["LOCAL_RANK"] = std::to_string(rank % lws);
  env["LOCAL_WORLD_SIZE"] = std::to_string(lws);
  env["GROUP_RANK"] = std::to_string(rank / lws);
  env["GROUP_WORLD_SIZE"] = std::to_string(world / lws);
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  env["TORCHELASTIC_RESTART_COUNT"] = "0";
  env["TORCHELASTIC_MAX_RESTARTS"] = "0";
  env["TORCHELASTIC_RUN_ID"] = run_id;
  env["FSDP_LAUNCHER"] = "fsdp-train";
  if (join_deadline_ms > 0) {
    env["FSDP_JOIN_DEADLINE_MS"] = std::to_string(join_deadline_ms);
  } else {
    env.erase("FSDP_JOIN_DEADLINE_MS");  // an outer launcher's is not this job's
  }
  // Share the cores among the local workers unless the user chose: N workers
  // each using every core oversubscribe the machine (torchrun sets
  // OMP_NUM_THREADS=1 for the same reason). LibTorch's CPU kernels and its
  // BLAS (MKL) use the OpenMP pool this sizes.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const std::string per_worker = std::to_string(std::max(1u, cores / static_cast<unsigned>(lws)));
  if (!env.count("OMP_NUM_THREADS")) env["OMP_NUM_THREADS"] = per_worker;
  for (const auto& [k, v] : o.env) {
    if (k != "LOCAL_WORLD_SIZE") env[k] = v;  // honoured through `lws`, with LOCAL_RANK to match
  }
  if (o.nccl_host_per_rank) {
    const auto given = env.find("NCCL_HOSTID");
    env["NCCL_HOSTID"] = detail::cat(given != env.end() ? given->second : run_id, "-rank", rank);
  }
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

// launch_local's checks of its options; returns the local world size
// (LOCAL_WORLD_SIZE: the ranks per simulated or real node).
int checked_local_world_size(const LaunchOptions& o) {
  FSDP_CHECK(!o.argv.empty(), "launch_local: argv is empty — pass the program and its arguments");
  FSDP_CHECK(o.nproc >= 1, "launch_local: nproc=", o.nproc, " must be at least 1");
  FSDP_CHECK(o.nnodes >= 1 && o.node_rank >= 0 && o.node_rank < o.nnodes, "launch_local: node_rank=", o.node_rank,
             " must be in [0, nnodes=", o.nnodes, ")");
  const bool multi_node = o.nnodes > 1;
  FSDP_CHECK(!multi_node || (!o.master_addr.empty() && o.master_port >= 1 && o.master_port <= 65535),
             "launch_local: with nnodes=", o.nnodes, " the master address and port must be set (got '",
             o.master_addr, "':", o.master_port, ") — every node's launcher needs node 0's address and a port");
  FSDP_CHECK(!multi_node || o.local_world_size == 0 || o.local_world_size == o.nproc,
             "launch_local: with nnodes > 1 a node's processes are one node: local_world_size must be nproc");
  int lws = o.local_world_size;
  if (multi_node) {
    lws = o.nproc;
  } else if (lws == 0) {
    const auto it = o.env.find("LOCAL_WORLD_SIZE");  // simulated nodes requested through env
    lws = it == o.env.end() ? o.nproc : std::atoi(it->second.c_str());
  }
  FSDP_CHECK(lws >= 1 && o.nproc % lws == 0, "launch_local: local_world_size=", lws,
             " must divide nproc=", o.nproc);
  FSDP_CHECK(o.kill_grace.count() >= 0, "launch_local: kill_grace must not be negative");
  FSDP_CHECK(o.signal_timeout.count() > 0, "launch_local: signal_timeout must be positive");
  FSDP_CHECK(o.join_timeout.count() >= 0, "launch_local: join_timeout must not be negative");
  return lws;
}

// The agent store: workers connect to it as clients (TORCHELASTIC_USE_AGENT_STORE).
// Several nodes: node 0 hosts it on the agreed port, the others none (and
// wait for node 0's until the join's deadline).
struct AgentStore {
  std::unique_ptr<c10d::TCPStore> store;  // null on a node other than 0
  std::string host;                       // where the workers reach it
  int port = 0;
};

AgentStore host_agent_store(const LaunchOptions& o, int64_t join_deadline_ms) {
  const bool multi_node = o.nnodes > 1;
  AgentStore out;
  c10d::TCPStoreOptions store_opts;
  store_opts.port = multi_node ? static_cast<uint16_t>(o.master_port) : 0;
  store_opts.isServer = true;
  store_opts.waitWorkers = false;
  out.host = multi_node ? o.master_addr : "127.0.0.1";
  std::unique_ptr<c10d::TCPStore>& store = out.store;
  if (multi_node && o.node_rank == 0) check_master_addr_is_here(o.master_addr);
  if (!multi_node || o.node_rank == 0) {
    try {
      store = std::make_unique<c10d::TCPStore>(out.host, store_opts);
      if (!multi_node && store->getPort() == 0) {  // a LibTorch that does not report the bound port
        store.reset();
        store_opts.port = static_cast<uint16_t>(probe_free_port());
        store = std::make_unique<c10d::TCPStore>(out.host, store_opts);
      }
    } catch (const std::exception& e) {
      FSDP_FAIL("launch_local: cannot host the rendezvous store on ", out.host, ":", store_opts.port, ": ",
                e.what(), multi_node ? " — is the port in use? choose another LaunchOptions::master_port" : "");
    }
  }
  if (multi_node && o.node_rank != 0 && join_deadline_ms > 0) {
    wait_for_store(o, Clock::time_point(std::chrono::milliseconds(join_deadline_ms)));
  }
  out.port = store ? static_cast<int>(store->getPort()) : o.master_port;
  return out;
}

// One node's workers for launch_local's steps: started, supervised until
// every one has exited (reaped, failures blamed, signals forwarded, the
// timeout and the kill grace kept), then summed up in a LaunchResult.
class LocalJob {
 public:
  LocalJob(const LaunchOptions& o, int first)
      : o_(o), first_(first), forwarding_(o.forward_signals), workers_(o.nproc),
        relay_stderr_(o.on_failure && o.log_dir.empty()), relay_(o.nproc) {
    result_.ranks.resize(static_cast<size_t>(o.nproc));
  }

  void start(const std::string& program, int lws, const AgentStore& store, const std::string& run_id,
             int64_t join_deadline_ms) {
    const int max_fd = static_cast<int>(std::min<long>(sysconf(_SC_OPEN_MAX), 65536));
    for (int r = 0; r < o_.nproc; ++r) {
      ChildSpec spec;
      spec.program = program;
      spec.argv = o_.argv;
      spec.env = worker_env(o_, first_ + r, lws, store.host, store.port, run_id, join_deadline_ms);
      auto& out = result_.ranks[static_cast<size_t>(r)];
      out.rank = first_ + r;
      if (!o_.log_dir.empty()) {
        out.log_file = detail::cat(o_.log_dir, "/rank", first_ + r, ".log");
        // Note [Output targets]: a log restarted; never through a dangling link, a directory or a socket.
        spec.log_fd = open_output_fd(out.log_file, "launch_local: log file", StreamMode::kTruncate);
      }
      if (relay_stderr_) spec.err_fd = relay_.open_pipe(r);
      pid_t pid = -1;
      try {
        pid = spawn(spec, max_fd);
      } catch (...) {
        if (spec.log_fd >= 0) close(spec.log_fd);
        if (spec.err_fd >= 0) close(spec.err_fd);
        throw;
      }
      if (spec.log_fd >= 0) close(spec.log_fd);
      if (spec.err_fd >= 0) close(spec.err_fd);
      workers_.started(r, pid);
      out.pid = pid;
    }
  }

  // Until every worker has exited.
  void supervise() {
    start_ = Clock::now();
    while (workers_.count_running() > 0) {
      reap();
      if (workers_.count_running() == 0) break;
      keep_deadlines();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (relay_stderr_) {
      for (int r = 0; r < o_.nproc; ++r) relay_.release(r);
    }
  }

  LaunchResult summarize() {
    LaunchResult& result = result_;
    result.ok = true;
    std::vector<int> stopped;
    for (const auto& out : result.ranks) {
      result.ok = result.ok && !out.signaled && out.code == 0;
      if (out.stopped) stopped.push_back(out.rank);
    }
    result.ok = result.ok && !result.timed_out;
    std::ostringstream msg;
    if (result.timed_out) {
      msg << "timed out after " << o_.timeout.count() << " ms; "
          << (still_running_at_timeout_.size() == 1 ? "rank " : "ranks ")
          << join_ranks(global(still_running_at_timeout_))
          << (still_running_at_timeout_.size() == 1 ? " was" : " were") << " still running (stopped)";
    } else if (result.failed_rank >= 0) {
      msg << blame_;
      if (!stopped.empty()) msg << "; stopped " << (stopped.size() == 1 ? "rank " : "ranks ") << join_ranks(stopped);
    } else if (result.signal_received != 0) {
      const char* name = strsignal(result.signal_received);
      msg << "received signal " << result.signal_received << " (" << (name ? name : "?")
          << ") and forwarded it to the workers";
      if (signal_timed_out_) {
        msg << "; they did not all exit within " << o_.signal_timeout.count() << " ms, so the launcher stopped "
            << (stopped.size() == 1 ? "rank " : "ranks ") << join_ranks(stopped);
      }
      for (const auto& out : result.ranks) msg << "; rank " << out.rank << " " << out.describe();
    } else if (result.ok) {
      msg << "all " << o_.nproc << (o_.nproc == 1 ? " rank" : " ranks") << " exited with code 0";
    } else {
      for (const auto& out : result.ranks) {
        if (out.signaled || out.code != 0) msg << "rank " << out.rank << " " << out.describe() << "; ";
      }
    }
    result.message = msg.str();
    result.exit_code = launch_exit_code(result);
    return std::move(result_);
  }

 private:
  // Global ranks of local workers.
  std::vector<int> global(std::vector<int> local) const {
    for (int& r : local) r += first_;
    return local;
  }

  void stop_all(int sig) {
    for (int r = 0; r < o_.nproc; ++r) {
      if (workers_.running(r)) result_.ranks[static_cast<size_t>(r)].stopped = true;
    }
    workers_.signal_all(sig);
    if (!stopping_) {
      stopping_ = true;
      kill_at_ = Clock::now() + o_.kill_grace;
    }
  }

  // The first failure: blame a suspended rank (the others time out waiting
  // for it), else one that died from a signal, else the first reaped.
  void blame_failure(const std::vector<int>& failed_now) {
    std::vector<int> suspended;
    for (int r = 0; r < o_.nproc; ++r) {
      if (!workers_.running(r)) continue;
      const char st = workers_.state(r);
      if (st == 'T' || st == 't') {
        suspended.push_back(r);
        result_.ranks[static_cast<size_t>(r)].suspended = true;
      }
    }
    int noticed = failed_now.front();
    for (int r : failed_now) {
      if (result_.ranks[static_cast<size_t>(r)].signaled) {
        noticed = r;
        break;
      }
    }
    const RankOutcome& n = result_.ranks[static_cast<size_t>(noticed)];
    if (suspended.empty()) {
      result_.failed_rank = noticed;
      blame_ = detail::cat("rank ", n.rank, " ", n.describe());
    } else {
      result_.failed_rank = suspended.front();
      blame_ = detail::cat(suspended.size() == 1 ? "rank " : "ranks ", join_ranks(global(suspended)),
                           suspended.size() == 1 ? " was" : " were",
                           " suspended (process state T, e.g. SIGSTOP): the others waited for ",
                           suspended.size() == 1 ? "it" : "them", " (rank ", n.rank, " ", n.describe(), ")");
    }
  }

  // Relays stderr, reaps the workers that exited, and on the first failure
  // blames it and stops the others.
  void reap() {
    if (relay_stderr_) {
      for (int r = 0; r < o_.nproc; ++r) relay_.pump(r);
    }
    std::vector<int> failed_now;
    for (int r = 0; r < o_.nproc; ++r) {
      int status = 0;
      if (!workers_.try_reap(r, &status)) continue;
      auto& out = result_.ranks[static_cast<size_t>(r)];
      out.signaled = WIFSIGNALED(status);
      out.signal = out.signaled ? WTERMSIG(status) : 0;
      out.code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
      if (relay_stderr_) relay_.drain(r);
      if (out.signaled || out.code != 0) {
        failed_now.push_back(r);
      } else if (relay_stderr_) {
        relay_.release(r);
      }
    }
    if (!failed_now.empty()) {
      if (!stopping_ && result_.signal_received == 0 && result_.failed_rank < 0) {
        blame_failure(failed_now);
        if (o_.on_failure) o_.on_failure(blame_);  // before the workers' own messages
        stop_all(SIGTERM);
      }
      if (relay_stderr_) {
        for (int r : failed_now) relay_.release(r);
      }
    }
  }

  // Forwards signals (a second one kills), and keeps the signal's deadline,
  // the run's timeout and the kill grace.
  void keep_deadlines() {
    const auto now = Clock::now();
    const int n_signals = g_signal_count.load();
    if (o_.forward_signals && n_signals > handled_signals_) {
      if (handled_signals_ == 0) {
        result_.signal_received = g_last_signal.load();
        workers_.signal_all(result_.signal_received);  // workers decide; keep waiting for them
        signal_deadline_ = now + o_.signal_timeout;
      } else {
        for (int r = 0; r < o_.nproc; ++r) {
          if (workers_.running(r)) result_.ranks[static_cast<size_t>(r)].stopped = true;
        }
        workers_.signal_all(SIGKILL);
        killed_ = true;
      }
      handled_signals_ = n_signals;
    }
    if (result_.signal_received != 0 && !stopping_ && now >= signal_deadline_) {
      signal_timed_out_ = true;  // a worker ignores the signal, is suspended, or hangs
      stop_all(SIGTERM);
    }
    if (o_.timeout.count() > 0 && !result_.timed_out && now - start_ >= o_.timeout) {
      result_.timed_out = true;
      for (int r = 0; r < o_.nproc; ++r) {
        if (workers_.running(r)) still_running_at_timeout_.push_back(r);
      }
      stop_all(SIGTERM);
    }
    if (stopping_ && !killed_ && now >= kill_at_) {
      workers_.signal_all(SIGKILL);
      killed_ = true;
    }
  }

  const LaunchOptions& o_;
  const int first_;  // global rank of local worker 0
  LaunchResult result_;
  SignalForwarding forwarding_;
  Workers workers_;
  const bool relay_stderr_;
  StderrRelay relay_;
  Clock::time_point start_{};
  bool stopping_ = false;
  Clock::time_point kill_at_{};
  bool killed_ = false;
  int handled_signals_ = 0;
  Clock::time_point signal_deadline_{};
  bool signal_timed_out_ = false;
  std::vector<int> still_running_at_timeout_;
  std::string blame_;  // the failure summary, once a rank failed
};

}  // namespace

LaunchResult launch_local(const LaunchOptions& o) {
  const int lws = checked_local_world_size(o);
  const bool multi_node = o.nnodes > 1;
  // One deadline for the join, from now: the workers' rendezvous gets what is left of it.
  const int64_t join_deadline_ms =
      o.join_timeout.count() > 0
          ? std::chrono::duration_cast<std::chrono::milliseconds>((Clock::now() + o.join_timeout).time_since_epoch())
                .count()
          : 0;
  const std::string program = resolve_program(o.argv[0]);
  if (!o.log_dir.empty()) {
    struct stat st {};
    FSDP_CHECK(stat(o.log_dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), "launch_local: log_dir '",
               o.log_dir, "' is not an existing directory — create it first");
  }
  std::string run_id = o.run_id;
  if (run_id.empty()) {
    run_id = multi_node ? detail::cat("fsdp-", o.master_addr, "-", o.master_port)  // the same on every node
                        : detail::cat("fsdp-", getpid(), "-", Clock::now().time_since_epoch().count());
  }
  const AgentStore store = host_agent_store(o, join_deadline_ms);
  LocalJob job(o, /*first=*/o.node_rank * o.nproc);
  job.start(program, lws, store, run_id, join_deadline_ms);
  job.supervise();
  return job.summarize();
}

int launch_self(const std::string& program, int argc, char** argv, LaunchOptions options) {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  options.argv.assign(1, n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string(argv[0]));
  for (int i = 1; i < argc; ++i) options.argv.emplace_back(argv[i]);
  // The summary comes first, before the workers' error lines; the final
  // message repeats it with what happened to the other ranks.
  if (!options.on_failure)
    options.on_failure = [program](const std::string& summary) { std::cerr << program << ": " << summary << std::endl; };
  const LaunchResult r = launch_local(options);
  if (!r.ok) std::cerr << program << ": " << r.message << "\n";
  return launch_exit_code(r);
}

Job start_job(const std::string& program, int argc, char** argv, int nproc_per_node, const std::string& device,
              InitOptions init, LaunchOptions options) {
  FSDP_CHECK(nproc_per_node >= 1, "start_job: nproc_per_node must be >= 1, got ", nproc_per_node);
  FSDP_CHECK(device == "cpu" || device == "cuda", "start_job: device must be cpu or cuda, got '", device, "'");
  Job job;
  const WorldInfo world = detect_world();
  if (nproc_per_node > 1 && world.launcher == "single") {  // not started by a launcher: become one
    options.nproc = nproc_per_node;
    job.launched = launch_self(program, argc, argv, options);
    return job;
  }
  if (device == "cuda") {
    job.device = worker_device("cuda", world.local_rank);
    set_current_device(job.device);  // before NCCL or any CUDA work
  }
  init.backend = choose_backend(init.backend, device == "cuda", "backend");
  job.runtime = init_process_group(world, init);
  return job;
}

}  // namespace fsdp::comm
