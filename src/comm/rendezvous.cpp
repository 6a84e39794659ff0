#include "fsdp/comm/rendezvous.h"

#include "fsdp/comm/backends.h"
#include "fsdp/common/error.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <thread>

namespace fsdp::comm {
namespace {

// Reads variables through the caller's getenv; an empty value counts as unset
// (`export RANK=` in a script).
class Env {
 public:
  explicit Env(const GetEnv& getenv) : getenv_(getenv) {}

  std::optional<std::string> get(const std::string& name) const {
    auto v = getenv_(name);
    if (v && v->empty()) return std::nullopt;
    return v;
  }
  bool has(const std::string& name) const { return get(name).has_value(); }

  // Parses an integer in [lo, hi]; `why` says what the variable is for.
  int64_t integer(const std::string& name, int64_t lo, int64_t hi) const {
    const auto v = get(name);
    FSDP_ASSERT(v.has_value(), name, " read before checking it is set");
    return parse(name, *v, lo, hi);
  }
  std::optional<int64_t> optional_integer(const std::string& name, int64_t lo, int64_t hi) const {
    if (!has(name)) return std::nullopt;
    return integer(name, lo, hi);
  }
  int64_t require(const std::string& name, int64_t lo, int64_t hi, const std::string& source) const {
    FSDP_CHECK(has(name), name, " is not set but the environment looks like ", source,
               " — set ", name, " (or unset the other ", source, " variables)");
    return integer(name, lo, hi);
  }

  static int64_t parse(const std::string& name, const std::string& v, int64_t lo, int64_t hi) {
    bool ok = !v.empty() && v.size() <= 18;
    for (char c : v) ok = ok && std::isdigit(static_cast<unsigned char>(c));
    FSDP_CHECK(ok, name, "='", v, "' is not a non-negative integer — fix or unset ", name);
    const int64_t x = std::stoll(v);
    FSDP_CHECK(x >= lo && x <= hi, name, "=", x, " is outside the valid range [", lo, ", ", hi,
               "]");
    return x;
  }

 private:
  const GetEnv& getenv_;
};

constexpr int64_t kMaxInt = std::numeric_limits<int>::max();

// Variable names behind each field, for error messages.
struct Names {
  std::string rank, world_size, local_rank, local_world_size, master_addr, master_port;
};

void validate(const WorldInfo& w, const Names& n) {
  FSDP_CHECK(w.world_size >= 1, n.world_size, "=", w.world_size, " must be at least 1");
  FSDP_CHECK(w.rank < w.world_size, n.rank, "=", w.rank, " is not below ", n.world_size, "=",
             w.world_size, " — ranks run from 0 to ", n.world_size, "-1");
  FSDP_CHECK(w.local_world_size >= 1 && w.local_world_size <= w.world_size, n.local_world_size,
             "=", w.local_world_size, " must be between 1 and ", n.world_size, "=", w.world_size);
  FSDP_CHECK(w.local_rank < w.local_world_size, n.local_rank, "=", w.local_rank,
             " is not below ", n.local_world_size, "=", w.local_world_size,
             " — local ranks run from 0 to ", n.local_world_size, "-1");
  if (w.world_size > 1) {
    FSDP_CHECK(!w.master_addr.empty(), n.master_addr, " is not set but ", n.world_size, "=",
               w.world_size, " — set ", n.master_addr, " to the host of rank 0 (or of the agent store)");
    FSDP_CHECK(w.master_port >= 1 && w.master_port <= 65535, n.master_port, " is not set or not a port (",
               w.master_port, ") but ", n.world_size, "=", w.world_size, " — set ", n.master_port,
               " to a free TCP port, e.g. 29500");
  }
}

bool parse_bool(const std::string& name, const std::string& v) {
  std::string l;
  for (char c : v) l += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (l == "true" || l == "1" || l == "yes") return true;
  if (l == "false" || l == "0" || l == "no") return false;
  FSDP_CHECK(false, name, "='", v, "' is not a boolean — use True or False");
  return false;
}

std::string first_of_list(const std::string& v) { return v.substr(0, v.find(',')); }

WorldInfo from_torchrun(const Env& env) {
  const std::string src = "a torchrun / fsdp-train worker (TORCHELASTIC_* is set)";
  WorldInfo w;
  w.launcher = env.get("FSDP_LAUNCHER").value_or("torchrun");
  w.world_size = static_cast<int>(env.require("WORLD_SIZE", 1, kMaxInt, src));
  w.rank = static_cast<int>(env.require("RANK", 0, kMaxInt, src));
  w.local_world_size =
      static_cast<int>(env.optional_integer("LOCAL_WORLD_SIZE", 1, kMaxInt).value_or(w.world_size));
  w.local_rank = static_cast<int>(env.optional_integer("LOCAL_RANK", 0, kMaxInt)
                                      .value_or(w.rank % w.local_world_size));
  w.node_rank = static_cast<int>(env.optional_integer("GROUP_RANK", 0, kMaxInt)
                                     .value_or(w.rank / w.local_world_size));
  FSDP_CHECK(env.has("MASTER_ADDR"), "MASTER_ADDR is not set but the environment looks like ",
             src, " — launch with torchrun or fsdp-train, which set it");
  w.master_addr = *env.get("MASTER_ADDR");
  w.master_port = static_cast<int>(env.require("MASTER_PORT", 1, 65535, src));
  const auto use_agent = env.get("TORCHELASTIC_USE_AGENT_STORE");
  w.agent_store = use_agent && parse_bool("TORCHELASTIC_USE_AGENT_STORE", *use_agent);
  if (w.agent_store) {
    // Validated, but not part of the prefix: each agent counts its own restarts,
    // so after a lost node the agents' counts can differ (Note [Join generations]).
    (void)env.optional_integer("TORCHELASTIC_RESTART_COUNT", 0, kMaxInt);
    w.store_prefix = "/worker/fsdp";
  }
  validate(w, {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"});
  return w;
}

WorldInfo from_plain_env(const Env& env) {
  const std::string src = "a plain-environment launch (RANK or WORLD_SIZE is set)";
  WorldInfo w;
  w.launcher = "env";
  w.world_size = static_cast<int>(env.require("WORLD_SIZE", 1, kMaxInt, src));
  w.rank = static_cast<int>(env.require("RANK", 0, kMaxInt, src));
  w.local_world_size = static_cast<int>(env.optional_integer("LOCAL_WORLD_SIZE", 1, kMaxInt).value_or(1));
  w.local_rank = static_cast<int>(env.optional_integer("LOCAL_RANK", 0, kMaxInt)
                                      .value_or(w.rank % w.local_world_size));
  auto node = env.optional_integer("GROUP_RANK", 0, kMaxInt);
  if (!node) node = env.optional_integer("NODE_RANK", 0, kMaxInt);
  w.node_rank = static_cast<int>(node.value_or(w.rank / w.local_world_size));
  w.master_addr = env.get("MASTER_ADDR").value_or("");
  if (env.has("MASTER_PORT")) w.master_port = static_cast<int>(env.integer("MASTER_PORT", 1, 65535));
  validate(w, {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"});
  return w;
}

WorldInfo from_slurm(const Env& env) {
  const std::string src = "a Slurm srun task (SLURM_PROCID is set)";
  WorldInfo w;
  w.launcher = "slurm";
  const std::string ntasks = env.has("SLURM_NTASKS") ? "SLURM_NTASKS" : "SLURM_NPROCS";
  w.world_size = static_cast<int>(env.require(ntasks, 1, kMaxInt, src));
  w.rank = static_cast<int>(env.require("SLURM_PROCID", 0, kMaxInt, src));
  w.local_rank = static_cast<int>(env.optional_integer("SLURM_LOCALID", 0, kMaxInt).value_or(0));
  w.node_rank = static_cast<int>(env.optional_integer("SLURM_NODEID", 0, kMaxInt).value_or(0));

  std::string lws_var = "SLURM_NTASKS_PER_NODE";
  if (env.has("SLURM_STEP_TASKS_PER_NODE")) {
    lws_var = "SLURM_STEP_TASKS_PER_NODE";
  } else if (!env.has("SLURM_NTASKS_PER_NODE") && env.has("SLURM_TASKS_PER_NODE")) {
    lws_var = "SLURM_TASKS_PER_NODE";
  }
  if (env.has(lws_var)) {
    const auto counts = expand_slurm_tasks_per_node(*env.get(lws_var), lws_var);
    // SLURM_NTASKS_PER_NODE is one number for every node.
    const size_t idx = counts.size() == 1 ? 0 : static_cast<size_t>(w.node_rank);
    FSDP_CHECK(idx < counts.size(), lws_var, "='", *env.get(lws_var), "' lists ", counts.size(),
               " nodes but SLURM_NODEID=", w.node_rank);
    w.local_world_size = counts[idx];
  }

  std::string nodelist_var;
  for (const char* v : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    if (env.has(v)) {
      nodelist_var = v;
      break;
    }
  }
  if (env.has("MASTER_ADDR")) {
    w.master_addr = *env.get("MASTER_ADDR");
  } else if (!nodelist_var.empty()) {
    const auto hosts = expand_slurm_nodelist(*env.get(nodelist_var), nodelist_var);
    FSDP_CHECK(!hosts.empty(), nodelist_var, " is empty");
    w.master_addr = hosts.front();
  }
  if (env.has("MASTER_PORT")) {
    w.master_port = static_cast<int>(env.integer("MASTER_PORT", 1, 65535));
  } else if (env.has("SLURM_JOB_ID")) {
    w.master_port = slurm_default_port(env.integer("SLURM_JOB_ID", 0, std::numeric_limits<int64_t>::max() / 2));
  }
  validate(w, {"SLURM_PROCID", ntasks, "SLURM_LOCALID", lws_var,
               "MASTER_ADDR (or SLURM_JOB_NODELIST)", "MASTER_PORT (or SLURM_JOB_ID)"});
  return w;
}

// Expands one name with bracket groups ("rack[1-2]-n[01-02]").
void expand_name(const std::string& name, const std::string& var, const std::string& whole,
                 std::vector<std::string>* out) {
  const size_t open = name.find('[');
  if (open == std::string::npos) {
    FSDP_CHECK(name.find(']') == std::string::npos, var, "='", whole, "': unmatched ']' in '",
               name, "'");
    out->push_back(name);
    return;
  }
  const size_t close = name.find(']', open);
  FSDP_CHECK(close != std::string::npos, var, "='", whole, "': unmatched '[' in '", name, "'");
  const std::string body = name.substr(open + 1, close - open - 1);
  FSDP_CHECK(body.find('[') == std::string::npos, var, "='", whole, "': nested '[' in '", name,
             "'");
  FSDP_CHECK(!body.empty(), var, "='", whole, "': empty range '[]' in '", name, "'");
  const std::string prefix = name.substr(0, open);
  const std::string rest = name.substr(close + 1);
  std::vector<std::string> tails;
  expand_name(rest, var, whole, &tails);
  size_t start = 0;
  while (start <= body.size()) {
    const size_t comma = std::min(body.find(',', start), body.size());
    const std::string range = body.substr(start, comma - start);
    const size_t dash = range.find('-');
    const std::string lo_s = range.substr(0, dash);
    const std::string hi_s = dash == std::string::npos ? lo_s : range.substr(dash + 1);
    auto digits = [](const std::string& s) {
      if (s.empty() || s.size() > 9) return false;
      for (char c : s) {
        if (!std::isdigit(static_cast<unsigned char>(c))) return false;
      }
      return true;
    };
    FSDP_CHECK(digits(lo_s) && digits(hi_s), var, "='", whole, "': '", range,
               "' is not a number or a range like 01-04");
    const long lo = std::stol(lo_s);
    const long hi = std::stol(hi_s);
    FSDP_CHECK(lo <= hi, var, "='", whole, "': range ", range, " runs backwards");
    FSDP_CHECK(hi - lo < 100000, var, "='", whole, "': range ", range, " is implausibly large");
    const size_t width = lo_s.size();
    for (long i = lo; i <= hi; ++i) {
      std::string num = std::to_string(i);
      if (num.size() < width) num.insert(0, width - num.size(), '0');
      for (const auto& t : tails) out->push_back(prefix + num + t);
    }
    start = comma + 1;
  }
}

}  // namespace

std::vector<std::string> expand_slurm_nodelist(const std::string& list, const std::string& var) {
  std::vector<std::string> hosts;
  int depth = 0;
  std::string item;
  auto flush = [&] {
    FSDP_CHECK(!item.empty(), var, "='", list, "': empty host name (stray comma?)");
    expand_name(item, var, list, &hosts);
    item.clear();
  };
  for (char c : list) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    FSDP_CHECK(depth == 0 || depth == 1, var, "='", list, "': unbalanced brackets");
    if (c == ',' && depth == 0) {
      flush();
    } else {
      item += c;
    }
  }
  FSDP_CHECK(depth == 0, var, "='", list, "': unmatched '['");
  flush();
  return hosts;
}

std::vector<int> expand_slurm_tasks_per_node(const std::string& spec, const std::string& var) {
  std::vector<int> counts;
  size_t start = 0;
  while (start <= spec.size()) {
    const size_t comma = std::min(spec.find(',', start), spec.size());
    const std::string item = spec.substr(start, comma - start);
    const size_t paren = item.find("(x");
    const std::string count_s = item.substr(0, paren);
    int64_t repeat = 1;
    if (paren != std::string::npos) {
      FSDP_CHECK(item.size() > paren + 3 && item.back() == ')', var, "='", spec, "': '", item,
                 "' is not like 2(x3)");
      repeat = Env::parse(var, item.substr(paren + 2, item.size() - paren - 3), 1, 100000);
    }
    const int64_t count = Env::parse(var, count_s, 1, 100000);
    for (int64_t i = 0; i < repeat; ++i) counts.push_back(static_cast<int>(count));
    start = comma + 1;
  }
  return counts;
}

int slurm_default_port(int64_t job_id) { return 15000 + static_cast<int>(job_id % 10000); }

WorldInfo detect_world(const GetEnv& getenv) {
  const Env env(getenv);
  WorldInfo w;
  bool elastic = false;
  for (const char* v : {"TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                        "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_MAX_RESTARTS"}) {
    elastic = elastic || env.has(v);
  }
  if (elastic) {
    w = from_torchrun(env);
  } else if (env.has("RANK") || env.has("WORLD_SIZE")) {
    w = from_plain_env(env);
  } else if (env.has("SLURM_PROCID")) {
    w = from_slurm(env);
  }
  if (const auto ifname = env.get("GLOO_SOCKET_IFNAME")) w.socket_ifname = first_of_list(*ifname);
  if (env.has("FSDP_JOIN_DEADLINE_MS")) {
    w.join_deadline_ms = env.integer("FSDP_JOIN_DEADLINE_MS", 1, std::numeric_limits<int64_t>::max() / 2);
  }
  if (const auto shm = env.get("FSDP_SHM")) {
    FSDP_CHECK(*shm == "0" || *shm == "1", "FSDP_SHM='", *shm, "' must be 1 (ranks on one host exchange through "
               "shared memory, the default) or 0 (loopback TCP)");
    w.shared_memory = *shm == "1";
  }
  return w;
}

WorldInfo detect_world() {
  return detect_world([](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  });
}

std::chrono::milliseconds parse_timeout(const std::string& text, const std::string& source) {
  // An environment variable is set as NAME=300; an option is given as NAME 300.
  const bool is_variable = source.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") == std::string::npos;
  const std::string fix = detail::cat(" — give ", source, " a number of seconds in (0, ", kMaxTimeoutSeconds,
                                      "], e.g. ", source, is_variable ? "=300" : " 300");
  double seconds = 0;
  size_t used = 0;
  bool parsed = false;
  try {
    seconds = std::stod(text, &used);
    parsed = used == text.size();
  } catch (const std::exception&) {  // not a number, or out of double's range
  }
  FSDP_CHECK(parsed, source, "='", text, "' is not a number of seconds", fix);
  FSDP_CHECK(std::isfinite(seconds) && seconds > 0 && seconds <= kMaxTimeoutSeconds, source, "=", text,
             " is outside (0, ", kMaxTimeoutSeconds, "] seconds", fix);
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000)));
}

namespace {

using Clock = std::chrono::steady_clock;

// The least a worker gets to join under a deadline its launcher set (see init_process_group).
constexpr std::chrono::seconds kMinJoinWindow{2};

std::string seconds_text(std::chrono::milliseconds ms) {
  std::ostringstream os;
  os << static_cast<double>(ms.count()) / 1000 << " s";
  return os.str();
}

using Addresses = std::unique_ptr<addrinfo, decltype(&freeaddrinfo)>;

// Step 1 of joining (rendezvous.h). c10d's TCPStore retries an unresolvable
// host itself, logging a warning every second until its timeout: resolve
// first, quietly after one note. Returns MASTER_ADDR:MASTER_PORT's addresses.
Addresses wait_until_resolvable(const WorldInfo& w, const InitOptions& o, Clock::time_point deadline) {
  const std::string port = std::to_string(w.master_port);
  bool noted = false;
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* result = nullptr;
    const int rc = getaddrinfo(w.master_addr.c_str(), port.c_str(), &hints, &result);
    if (rc == 0) return Addresses(result, &freeaddrinfo);
    const std::string why = rc == EAI_SYSTEM ? std::strerror(errno) : gai_strerror(rc);
    if (Clock::now() >= deadline) {
      FSDP_CHECK(false, "MASTER_ADDR=", w.master_addr, " does not resolve to an address (", why,
                 ") after trying for ", seconds_text(o.store_timeout), " (", o.timeout_source,
                 ") — set MASTER_ADDR to the host name or IP address of rank 0 (or of the agent store)");
    }
    if (!noted) {
      std::cerr << rank_tag() << "MASTER_ADDR=" << w.master_addr << " does not resolve yet (" << why
                << "); retrying quietly for up to " << seconds_text(o.store_timeout) << "\n";
      noted = true;
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(std::chrono::seconds(1), deadline - Clock::now()));
  }
}

// A client started before rank 0 listens is refused, and c10d's TCPStore then
// backs off for a random time that can outlast a short --timeout (or the whole
// life of a short job) although the store came up long before. So a client
// first probes the port itself every 100 ms, each connect bounded to 500 ms,
// until it accepts or the deadline passes. False: nothing listened by then.
bool wait_until_listening(const Addresses& addresses, Clock::time_point deadline) {
  while (Clock::now() < deadline) {
    for (const addrinfo* a = addresses.get(); a != nullptr; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      timeval tv{0, 500000};
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));  // bounds connect() on Linux
      const bool up = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
      ::close(fd);
      if (up) return true;
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(std::chrono::milliseconds(100), deadline - Clock::now()));
  }
  return false;
}

std::string text_of(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> bytes_of(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

// Note [Join generations]
// Joining writes claims into the store: the job's WORLD_SIZE, each RANK's
// holder, and then each rank's "ready" once it saw every claim. Under
// torchrun (agent store) the store outlives the workers, and the restart
// count cannot tell worker groups apart: a membership change restarts them
// without a new TORCHELASTIC_RESTART_COUNT, and each agent counts only its own
// workers' failures (after a node's link is cut and restored, one agent may
// be at attempt 1 and the other at 2), so all of them use one prefix and the
// claims of killed workers stay. So
// the keys live under a generation, fsdp/job/<g>/, and under torchrun a claim
// found taken (the agent hands out ranks: it can only be a dead incarnation's)
// or another WORLD_SIZE (an elastic job that changed size) moves the job to
// generation g + 1 (compare-and-set, so once), and every process waiting in
// g follows. A rank is through when every rank is ready in one generation:
// ready needs every claim of that generation, which a rank whose claim was
// taken never makes there, so no rank finishes in a generation that others
// left. Elsewhere (plain environment, Slurm) ranks are the user's: a taken
// RANK or another WORLD_SIZE is a mistake, refused for every process (the
// note under "abort"). Everything the job stores afterwards goes under its
// generation's prefix (init_process_group).
constexpr const char* kGenerationKey = "fsdp/job/generation";

// Records why the job cannot start, for the processes still joining, and
// throws it. The store's host keeps it up a little longer: the others poll
// for the note at least every 500 ms, and without the store they could only
// say that it went away.
[[noreturn]] void abort_join(c10d::Store& store, const std::string& abort_key, const std::string& note, bool hosting) {
  try {
    store.compareSet(abort_key, {}, bytes_of(note));  // the first reason stays
  } catch (const std::exception&) {  // best effort: this process fails anyway
  }
  if (hosting) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  detail::throw_usage(note);
}

// c10d's messages carry a C++ stack trace after their first line.
std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

int64_t generation_of(c10d::Store& store) {
  if (!store.check({kGenerationKey})) return 0;
  return std::stoll(text_of(store.get(kGenerationKey)));
}

// Steps 2 and 3 of joining (rendezvous.h); returns the generation's key prefix.
std::string join_job(c10d::Store& store, const WorldInfo& w, const InitOptions& o, Clock::time_point deadline,
                     bool hosting) {
  const std::string where = detail::cat("the job at ", w.master_addr, ":", w.master_port);
  // Only torchrun's agents restart worker groups (Note [Join generations]);
  // fsdp-train's launcher starts its workers once, so a mismatch there is a
  // mistake to name, not a new generation.
  const bool elastic = w.agent_store && w.launcher == "torchrun";
  const std::string mine = std::to_string(w.world_size);
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  const std::string me = detail::cat(host, " pid ", getpid(), " #", std::random_device{}());
  const auto note_at = Clock::now() + std::chrono::seconds(10);
  bool noted = false;
  for (;;) {
    const int64_t g = generation_of(store);
    const std::string prefix = detail::cat("fsdp/job/", g, "/");
    const std::string abort_key = prefix + "abort";
    const auto next_generation = [&] {
      store.compareSet(kGenerationKey, g == 0 ? std::vector<uint8_t>{} : bytes_of(std::to_string(g)),
                       bytes_of(std::to_string(g + 1)));
    };
    const std::string job = text_of(store.compareSet(prefix + "world_size", {}, bytes_of(mine)));
    if (job != mine) {
      if (elastic) {
        next_generation();
        continue;
      }
      abort_join(store, abort_key,
                 w.launcher == "fsdp-train"
                     ? detail::cat("world size mismatch: a node of ", where, " was started with "
                                   "LaunchOptions::nnodes x LaunchOptions::nproc = ", mine, " processes (its rank ",
                                   w.rank, "), the job has ", job, " — start every node with the same "
                                   "LaunchOptions::nnodes and LaunchOptions::nproc")
                     : detail::cat("WORLD_SIZE mismatch: a process started as rank ", w.rank, " with WORLD_SIZE=",
                                   mine, " joined ", where, ", which has WORLD_SIZE=", job,
                                   " — start every process of a job with the same WORLD_SIZE"),
                 hosting);
    }
    // Settings every process must share (InitOptions::agreed): the first one's are the job's.
    for (const auto& [flag, value] : o.agreed) {
      const std::string agreed = text_of(store.compareSet(prefix + "agreed/" + flag, {}, bytes_of(value)));
      if (agreed != value) {
        abort_join(store, abort_key,
                   detail::cat(flag, " mismatch: a process of ", where, " (rank ", w.rank, ") was started with ", flag,
                               " ", value, ", the job has ", flag, " ", agreed, " — give every ",
                               w.launcher == "fsdp-train" ? "node" : "process", " the same ", flag),
                   hosting);
      }
    }
    const std::string holder = text_of(store.compareSet(detail::cat(prefix, "rank/", w.rank), {}, bytes_of(me)));
    if (holder != me) {
      if (elastic) {
        next_generation();
        continue;
      }
      abort_join(store, abort_key,
                 detail::cat("RANK=", w.rank, " is taken twice in ", where, ": by ",
                             holder.substr(0, holder.find(" #")), " and by ", host, " pid ", getpid(),
                             " — give every process a distinct RANK in [0, ", w.world_size, ")"),
                 hosting);
    }
    // Waits until every rank has `what` in this generation: true; false when the job moved on.
    const auto wait_for_all = [&](const char* what) {
      std::vector<std::string> keys;
      for (int r = 0; r < w.world_size; ++r) keys.push_back(detail::cat(prefix, what, "/", r));
      auto missing = [&] {
        std::ostringstream os;
        int n = 0;
        for (int r = 0; r < w.world_size; ++r) {
          if (!store.check({keys[static_cast<size_t>(r)]})) os << (n++ ? ", " : "") << r;
        }
        return std::make_pair(n, os.str());
      };
      auto pause = std::chrono::milliseconds(10);
      for (;;) {
        // Polled, not a store wait(): c10d logs a warning for every wait that
        // times out, and a note from a failed process must be seen within a second.
        if (store.check(keys)) return true;
        if (store.check({abort_key})) detail::throw_usage(text_of(store.get(abort_key)));
        if (generation_of(store) != g) return false;
        const auto [n, ranks] = missing();
        if (n == 0) return true;
        const char* which = n == 1 ? "rank " : "ranks ";
        if (Clock::now() >= deadline) {
          FSDP_FAIL(which, ranks, " did not join ", where, " within ", seconds_text(o.store_timeout), " (",
                    o.timeout_source, "): ", n == 1 ? "it" : "they",
                    " did not start, failed before joining, or cannot reach the store — see ", n == 1 ? "its" : "their",
                    " log; every process needs the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE");
        }
        if (!noted && Clock::now() >= note_at) {
          std::cerr << rank_tag() << "waiting for " << which << ranks << " to join " << where << " (giving up after "
                    << seconds_text(o.store_timeout) << ", " << o.timeout_source << ")\n";
          noted = true;
        }
        std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - Clock::now()));
        pause = std::min(pause * 2, std::chrono::milliseconds(500));
      }
    };
    if (!wait_for_all("rank")) continue;
    store.set(detail::cat(prefix, "ready/", w.rank), bytes_of(me));
    if (!wait_for_all("ready")) continue;
    return prefix;
  }
}

}  // namespace

std::string choose_backend(const std::string& name, bool cuda, const std::string& flag) {
  const char* device = cuda ? "cuda" : "cpu";
  if (name == "auto") return cuda ? "nccl" : "tcp";
  const bool cpu_group = name == "tcp" || name == "gloo";
  const bool cuda_group = name == "nccl" || name == "c10d-nccl";
  FSDP_CHECK(cpu_group || cuda_group, "unknown ", flag, " '", name,
             "' — use tcp or gloo (CPU), nccl or c10d-nccl (CUDA), or auto (tcp on the CPU, nccl on CUDA)");
  FSDP_CHECK(cpu_group != cuda, flag, " ", name, " runs on ", cpu_group ? "the CPU" : "CUDA", " but the job's device is ",
             device, " — use ", cuda ? "nccl or c10d-nccl" : "tcp or gloo", ", or auto");
  return name;
}

Runtime init_process_group(const WorldInfo& world, const InitOptions& options) {
  set_rank_tag(world.rank, world.world_size);
  const std::string backend = options.backend == "auto" ? "tcp" : options.backend;
  const bool cuda = backend == "nccl" || backend == "c10d-nccl";
  choose_backend(backend, cuda, "backend");  // the name's check
  Runtime rt;
  rt.world = world;
  if (world.world_size == 1 && world.master_addr.empty()) {
    rt.store = c10::make_intrusive<c10d::HashStore>();
  } else {
    // One deadline for every step of the join (and for the launcher's work before it).
    // A worker started after its launcher spent most of the deadline (loading, a
    // busy machine) still gets kMinJoinWindow to connect to a store that is up.
    const auto now = Clock::now();
    auto deadline = now + options.store_timeout;
    if (world.join_deadline_ms > 0) {
      const auto shared = Clock::time_point(std::chrono::milliseconds(world.join_deadline_ms));
      deadline = std::min(deadline, std::max(shared, now + std::min<Clock::duration>(kMinJoinWindow,
                                                                                        options.store_timeout)));
    }
    const Addresses addresses = wait_until_resolvable(world, options, deadline);
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(world.master_port);
    o.isServer = !world.agent_store && world.rank == 0;
    o.waitWorkers = false;
    if (!o.isServer && !wait_until_listening(addresses, deadline)) {
      FSDP_FAIL("nothing listens at MASTER_ADDR:MASTER_PORT = ", world.master_addr, ":", world.master_port,
                " (launcher: ", world.launcher, ") within ", seconds_text(options.store_timeout), " (",
                options.timeout_source, "): the process hosting the store (",
                world.agent_store ? "the launcher of node 0" : "rank 0",
                ") did not start, failed, or listens elsewhere — check that it runs and that every process has its "
                "address and port");
    }
    // What is left of the deadline (at least a second to connect to a store that just answered).
    o.timeout = std::max<std::chrono::milliseconds>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()), std::chrono::seconds(1));
    c10::intrusive_ptr<c10d::Store> tcp;
    try {
      tcp = c10::make_intrusive<c10d::TCPStore>(world.master_addr, o);
    } catch (const std::exception& e) {
      FSDP_FAIL(o.isServer ? "hosting" : "connecting to", " the rendezvous store at ",
                world.master_addr, ":", world.master_port, " (launcher: ", world.launcher,
                ") failed within ", seconds_text(options.store_timeout), ": ", first_line(e.what()),
                o.isServer ? " — is the port already in use? pick another MASTER_PORT"
                           : " — check MASTER_ADDR/MASTER_PORT and that rank 0 (or the agent) is up");
    }
    rt.store = tcp;
    if (!world.store_prefix.empty()) {
      rt.store = c10::make_intrusive<c10d::PrefixStore>(world.store_prefix, tcp);
    }
    try {
      // The process whose exit takes the store down waits a little after a refusal
      // (abort_join): rank 0 hosting it, or a worker of node 0's fsdp-train launcher.
      const bool store_goes_with_me =
          o.isServer || (world.agent_store && world.launcher == "fsdp-train" && world.node_rank == 0);
      const std::string generation = join_job(*rt.store, world, options, deadline, store_goes_with_me);
      rt.store = c10::make_intrusive<c10d::PrefixStore>(generation, rt.store);
    } catch (const fsdp::Failure&) {
      throw;
    } catch (const std::exception& e) {  // the store itself failed
      FSDP_FAIL("joining the job at ", world.master_addr, ":", world.master_port,
                " failed: the rendezvous store stopped answering (", first_line(e.what()),
                ") — the process hosting it (", o.isServer ? "this one" : world.agent_store ? "the launcher" : "rank 0",
                ") exited or crashed; see its log");
    }
  }
  auto pg_store = c10::make_intrusive<c10d::PrefixStore>("fsdp/pg/world", rt.store);
  TcpTransportOptions t;
  t.master_addr = world.master_addr;
  t.socket_ifname = world.socket_ifname;
  t.single_node = world.local_world_size == world.world_size;
  t.shared_memory = world.shared_memory;
  if (backend == "tcp") {
    rt.world_group = make_tcp_group(pg_store, world.rank, world.world_size, "world", options.timeout, t);
  } else if (backend == "gloo") {
    rt.world_group = make_gloo_group(pg_store, world.rank, world.world_size, "world", options.timeout, t,
                                     options.reductions.value_or(C10dReductions::kRankOrder));
  } else {
    const int gpu = options.cuda_device.value_or(world.local_rank);
    rt.world_group = backend == "nccl" ? make_nccl_group(pg_store, world.rank, world.world_size, "world",
                                                         options.timeout, gpu)
                                       : make_torch_nccl_group(pg_store, world.rank, world.world_size, "world",
                                                               options.timeout, gpu);
    auto cpu_store = c10::make_intrusive<c10d::PrefixStore>("fsdp/pg/cpu", rt.store);
    rt.cpu_group = make_tcp_group(cpu_store, world.rank, world.world_size, "cpu", options.timeout, t);
  }
  return rt;
}

}  // namespace fsdp::comm
