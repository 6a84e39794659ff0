#include "comm/shm_transport.h"

#include "fsdp/common/error.h"
#include "fsdp/common/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <thread>

namespace fsdp::comm::shm {

// Note [Shared memory]
// Ranks of a lane that share a host exchange bytes through memory instead of
// loopback TCP: the sender copies into a ring in a shared segment, the
// receiver copies out, with no system call per transfer and no protocol
// stack in between. Everything above the byte streams is unchanged: the same
// per-peer FIFOs of posted ranges (Note [TCP transport]), so the collectives,
// their rank-order sums and their byte counts for timeout reports are the
// TCP path's.
// Which ranks share a host: each publishes the kernel's boot id, the
// device and inode of /dev/shm (ranks in containers with private /dev/shm
// mounts differ there) and its network namespace (ranks that reach each
// other through a network of their own are separate hosts to the job: pods,
// or the emulated nodes of the cluster tests, whose links must carry the
// bytes), and tries; a pair uses the segment only when both
// ends mapped it, else its TCP connection, so a failure to create or map the
// segment (a /dev/shm too small: docker's default is 64 MiB) costs speed, not
// correctness. The segment's pages are reserved at creation
// (posix_fallocate), so a full /dev/shm shows then, never as SIGBUS later.
// Lifetime: the name exists only while the host's ranks map the segment;
// every one of them unlinks it once all have answered, so it disappears with
// the last mapping, also when the job is killed. A job killed in the
// milliseconds between creation and unlinking leaves its name, with its
// creator's pid in it: remove_stale_segments() runs before each creation and
// removes names whose creator is gone.
// Waiting: a rank with nothing to move reads its doorbell, spins briefly,
// then sleeps on it (futex, shared between processes) for at most a few
// milliseconds at a time; producers ring the consumer's bell after adding
// bytes and consumers the producer's after freeing space. Between sleeps the
// waiter polls the peers' silent sockets: a peer that exits or crashes closes
// them, and the collective fails at once naming it, as on TCP.

namespace {

constexpr uint64_t kMagic = 0x4653445053484d31ULL;  // "FSDPSHM1"
constexpr size_t kPage = 4096;
constexpr size_t kLine = 64;
constexpr size_t kBudgetBytes = size_t{32} << 20;  // rings of one segment, at most
constexpr size_t kMinRing = size_t{256} << 10;
constexpr size_t kMaxRing = size_t{4} << 20;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

std::string read_line(const char* path) {
  const std::string text = read_system_file(path);
  return text.substr(0, text.find('\n'));
}

// Ranks with equal identities can map one segment (Note [Shared memory]); "" if unknown.
std::string host_identity() {
  struct stat st{};
  if (::stat("/dev/shm", &st) != 0) return "";
  const std::string boot = read_line("/proc/sys/kernel/random/boot_id");
  if (boot.empty()) return "";
  struct stat net{};
  if (::stat("/proc/self/ns/net", &net) != 0) return "";
  return detail::cat(boot, " ", static_cast<uint64_t>(st.st_dev), ":", static_cast<uint64_t>(st.st_ino), " net:",
                     static_cast<uint64_t>(net.st_ino));
}

std::string key(const std::string& lane, const std::string& what) { return detail::cat("shm/", lane, "/", what); }

void set(c10d::Store& store, const std::string& k, const std::string& v) {
  store.set(k, std::vector<uint8_t>(v.begin(), v.end()));
}

std::string get(c10d::Store& store, const std::string& k) {
  const auto v = store.get(k);
  return std::string(v.begin(), v.end());
}

bool wait_key(c10d::Store& store, const std::string& k, Clock::time_point deadline) {
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    if (store.check({k})) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
}

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

// The segment's layout for `members` ranks with rings of `ring` bytes.
struct Layout {
  size_t bells = 0, headers = 0, data = 0, total = 0;
  Layout(int members, size_t ring) {
    const size_t pairs = static_cast<size_t>(members) * static_cast<size_t>(members - 1);
    bells = kPage;
    headers = bells + round_up(static_cast<size_t>(members) * kLine, kPage);
    data = headers + round_up(pairs * 2 * kLine, kPage);
    total = data + pairs * ring;
  }
};

size_t pair_index(int from, int to, int members) {
  return static_cast<size_t>(from) * static_cast<size_t>(members - 1) + static_cast<size_t>(to < from ? to : to - 1);
}

// Maps `bytes` of `fd` shared; null with *failed set when it cannot.
char* map_shared(int fd, size_t bytes, std::string* failed) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p != MAP_FAILED) return static_cast<char*>(p);
  *failed = detail::cat("mmap: ", std::strerror(errno));
  return nullptr;
}

uint64_t random_suffix() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) | rd();
}

}  // namespace

// Bytes are published (head or tail moved) every kPiece bytes, so the other
// end can start on the first piece while this one copies the next.
constexpr size_t kPiece = size_t{256} << 10;

size_t Ring::write(const char* p, size_t n) {
  uint64_t head = head_->load(std::memory_order_relaxed);
  const uint64_t tail = tail_->load(std::memory_order_acquire);
  const size_t k = std::min<size_t>(n, capacity_ - (head - tail));
  for (size_t done = 0; done < k;) {
    const size_t at = head % capacity_;
    const size_t len = std::min({k - done, kPiece, capacity_ - at});
    std::memcpy(data_ + at, p + done, len);
    done += len;
    head += len;
    head_->store(head, std::memory_order_release);
  }
  return k;
}

size_t Ring::read(char* p, size_t n) {
  uint64_t tail = tail_->load(std::memory_order_relaxed);
  const uint64_t head = head_->load(std::memory_order_acquire);
  const size_t k = std::min<size_t>(n, head - tail);
  for (size_t done = 0; done < k;) {
    const size_t at = tail % capacity_;
    const size_t len = std::min({k - done, kPiece, capacity_ - at});
    std::memcpy(p + done, data_ + at, len);
    done += len;
    tail += len;
    tail_->store(tail, std::memory_order_release);
  }
  return k;
}

std::string segment_name(long pid, uint64_t pid_ns, uint64_t random) {
  char suffix[17];
  std::snprintf(suffix, sizeof(suffix), "%016llx", static_cast<unsigned long long>(random));
  return detail::cat(kSegmentPrefix, pid, ".", pid_ns, ".", suffix);
}

uint64_t pid_namespace() {
  struct stat st{};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

namespace {

// "<digits>" without a sign or leading zero, fitting `max`; -1 otherwise.
long long decimal(const std::string& s, long long max) {
  if (s.empty() || s.size() > 19 || s[0] == '0' || s.find_first_not_of("0123456789") != std::string::npos) return -1;
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), nullptr, 10);
  return errno == 0 && v <= static_cast<unsigned long long>(max) ? static_cast<long long>(v) : -1;
}

// The creator pid of `name` when it is exactly segment_name(pid, ns, *) with
// ns == `ns`; -1 for any other name.
long stale_candidate(const std::string& name, uint64_t ns) {
  const std::string prefix = kSegmentPrefix;
  if (name.compare(0, prefix.size(), prefix) != 0) return -1;
  const size_t a = name.find('.', prefix.size());
  const size_t b = a == std::string::npos ? a : name.find('.', a + 1);
  if (b == std::string::npos) return -1;
  const std::string hex = name.substr(b + 1);
  if (hex.size() != 16 || hex.find_first_not_of("0123456789abcdef") != std::string::npos) return -1;
  const long long pid = decimal(name.substr(prefix.size(), a - prefix.size()), INT_MAX);
  const long long in_ns = decimal(name.substr(a + 1, b - a - 1), LLONG_MAX);
  if (pid <= 0 || in_ns <= 0 || static_cast<uint64_t>(in_ns) != ns) return -1;
  return static_cast<long>(pid);
}

}  // namespace

int remove_stale_segments() {
  const uint64_t ns = pid_namespace();
  if (ns == 0) return 0;  // no way to tell our pids from another namespace's
  const int dir_fd = ::open("/dev/shm", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return 0;
  DIR* dir = ::fdopendir(dir_fd);
  if (dir == nullptr) {
    ::close(dir_fd);
    return 0;
  }
  int removed = 0;
  while (dirent* e = ::readdir(dir)) {
    const std::string name = e->d_name;
    const long pid = stale_candidate(name, ns);
    if (pid <= 0) continue;
    struct stat st{};
    if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) continue;  // a link, or another user's
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // its creator lives (or may)
    if (::shm_unlink(("/" + name).c_str()) == 0) ++removed;
  }
  ::closedir(dir);
  return removed;
}

std::unique_ptr<HostSegment> HostSegment::connect(c10d::Store& store, const std::string& lane,
                                                  const std::string& where, int rank, int size,
                                                  Clock::time_point deadline, std::string* note) {
  // --- who shares this host
  const std::string me = host_identity();
  set(store, key(lane, detail::cat("host/", rank)), me);
  std::vector<int> members;
  for (int q = 0; q < size; ++q) {
    const std::string k = key(lane, detail::cat("host/", q));
    if (q != rank && !wait_key(store, k, deadline)) {
      FSDP_FAIL(where, ": rank ", q, " did not publish its host for shared memory in time — see its log");
    }
    if (!me.empty() && (q == rank || get(store, k) == me)) members.push_back(q);
  }
  if (members.size() < 2) {
    *note = me.empty() ? "no /dev/shm or boot id on this host" : "no other rank on this host";
    return nullptr;
  }
  std::unique_ptr<HostSegment> seg(new HostSegment());
  seg->rank_ = rank;
  seg->members_ = static_cast<int>(members.size());
  seg->index_.assign(static_cast<size_t>(size), -1);
  seg->mapped_.assign(static_cast<size_t>(size), false);
  for (size_t i = 0; i < members.size(); ++i) seg->index_[static_cast<size_t>(members[i])] = static_cast<int>(i);
  const size_t pairs = members.size() * (members.size() - 1);
  seg->ring_bytes_ = std::clamp(kBudgetBytes / pairs / kPage * kPage, kMinRing, kMaxRing);
  const Layout layout(seg->members_, seg->ring_bytes_);
  seg->bytes_ = layout.total;

  // --- the lowest rank of the host creates, the others map
  const int leader = members.front();
  const std::string name_key = key(lane, detail::cat("name/", leader));
  std::string name, failed;
  if (rank == leader) {
    remove_stale_segments();
    name = "/" + segment_name(::getpid(), pid_namespace(), random_suffix());
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      failed = detail::cat("shm_open: ", std::strerror(errno));
    } else {
      int err = ::ftruncate(fd, static_cast<off_t>(layout.total)) == 0 ? 0 : errno;
      if (err == 0) err = ::posix_fallocate(fd, 0, static_cast<off_t>(layout.total));
      if (err != 0) {
        failed = detail::cat("reserving ", layout.total >> 20, " MiB in /dev/shm: ", std::strerror(err));
      } else {
        seg->base_ = map_shared(fd, layout.total, &failed);
        if (seg->base_ != nullptr) std::memcpy(seg->base_, &kMagic, sizeof(kMagic));
      }
      ::close(fd);
      if (!failed.empty()) ::shm_unlink(name.c_str());
    }
    set(store, name_key, failed.empty() ? name : "-" + failed);
  } else {
    if (!wait_key(store, name_key, deadline)) {
      FSDP_FAIL(where, ": rank ", leader, " did not create the shared-memory segment of this host in time — see "
                "its log");
    }
    name = get(store, name_key);
    if (!name.empty() && name[0] == '-') {
      failed = detail::cat("rank ", leader, " could not create it: ", name.substr(1));
    } else {
      const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
      struct stat st{};
      if (fd < 0 || ::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != layout.total) {
        failed = detail::cat("cannot open ", name, ": ", fd < 0 ? std::strerror(errno) : "unexpected size");
      } else {
        seg->base_ = map_shared(fd, layout.total, &failed);
        uint64_t magic = 0;
        if (seg->base_ != nullptr) std::memcpy(&magic, seg->base_, sizeof(magic));
        if (seg->base_ != nullptr && magic != kMagic) failed = "the segment is not initialized";
      }
      if (fd >= 0) ::close(fd);
    }
  }
  if (!failed.empty() && seg->base_ != nullptr) {
    ::munmap(seg->base_, seg->bytes_);
    seg->base_ = nullptr;
  }
  set(store, key(lane, detail::cat("mapped/", rank)), failed.empty() ? "1" : failed);

  // --- every rank of the host answered: the name can go
  for (int q : members) {
    const std::string k = key(lane, detail::cat("mapped/", q));
    if (q != rank && !wait_key(store, k, deadline)) {
      if (failed.empty() && !name.empty()) ::shm_unlink(name.c_str());
      FSDP_FAIL(where, ": rank ", q, " did not map the shared-memory segment of this host in time — see its log");
    }
    seg->mapped_[static_cast<size_t>(q)] = failed.empty() && get(store, k) == "1";
  }
  if (!name.empty() && name[0] == '/') ::shm_unlink(name.c_str());  // ENOENT once another rank did it
  if (!failed.empty()) {
    *note = failed;
    return nullptr;
  }
  int shared = 0;
  for (int q = 0; q < size; ++q) shared += q != rank && seg->shares(q) ? 1 : 0;
  if (shared == 0) {
    *note = "no other rank of this host mapped the segment";
    return nullptr;
  }
  return seg;
}

HostSegment::~HostSegment() {
  if (base_ != nullptr) ::munmap(base_, bytes_);
}

std::atomic<uint32_t>* HostSegment::bell_of(int rank) const {
  const Layout layout(members_, ring_bytes_);
  return reinterpret_cast<std::atomic<uint32_t>*>(base_ + layout.bells +
                                                  static_cast<size_t>(index_[static_cast<size_t>(rank)]) * kLine);
}

Ring HostSegment::ring_between(int from, int to) const {
  const Layout layout(members_, ring_bytes_);
  const size_t i = pair_index(index_[static_cast<size_t>(from)], index_[static_cast<size_t>(to)], members_);
  char* header = base_ + layout.headers + i * 2 * kLine;
  return Ring(reinterpret_cast<std::atomic<uint64_t>*>(header), reinterpret_cast<std::atomic<uint64_t>*>(header + kLine),
              base_ + layout.data + i * ring_bytes_, ring_bytes_);
}

Ring HostSegment::send_ring(int peer) const { return ring_between(rank_, peer); }
Ring HostSegment::recv_ring(int peer) const { return ring_between(peer, rank_); }

uint32_t HostSegment::bell() const { return bell_of(rank_)->load(std::memory_order_acquire); }

void HostSegment::ring(int peer) const {
  std::atomic<uint32_t>* b = bell_of(peer);
  b->fetch_add(1, std::memory_order_acq_rel);
  futex(b, FUTEX_WAKE, INT_MAX, nullptr);
}

void HostSegment::wait(uint32_t seen, int timeout_ms) const {
  const timespec ts{timeout_ms / 1000, static_cast<long>(timeout_ms % 1000) * 1000000L};
  futex(bell_of(rank_), FUTEX_WAIT, seen, &ts);  // EAGAIN when it already rang; EINTR, ETIMEDOUT: look again
}

}  // namespace fsdp::comm::shm
