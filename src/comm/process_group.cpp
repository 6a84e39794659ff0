// Argument checks, byte counters and hybrid layout shared by every backend.
#include "fsdp/comm/process_group.h"

#include "fsdp/common/error.h"

#include <mutex>
#include <sstream>

namespace fsdp::comm {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
  }
  return "unknown";
}

namespace {

class CompletedWork final : public Work {
 public:
  void wait() override {}
  bool completed() override { return true; }
};

// Dtypes every backend moves; reductions further exclude bool.
bool is_supported_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
    case at::kDouble:
    case at::kBFloat16:
    case at::kHalf:
    case at::kInt:
    case at::kLong:
    case at::kShort:
    case at::kByte:
    case at::kChar:
    case at::kBool:
      return true;
    default:
      return false;
  }
}

std::string describe(const at::Tensor& t) {
  if (!t.defined()) return "an undefined tensor";
  std::ostringstream os;
  os << t.scalar_type() << "[" << t.numel() << "] on " << t.device();
  return os.str();
}

// Both ranges [p, p+n) of the same storage overlap.
bool overlaps(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const auto* a0 = static_cast<const char*>(a.data_ptr());
  const auto* b0 = static_cast<const char*>(b.data_ptr());
  const auto* a1 = a0 + a.numel() * a.element_size();
  const auto* b1 = b0 + b.numel() * b.element_size();
  return a0 < b1 && b0 < a1;
}

}  // namespace

WorkPtr completed_work() { return std::make_shared<CompletedWork>(); }

struct ProcessGroup::Counters {
  std::mutex mu;
  CommCounters c;
};

ProcessGroup::ProcessGroup(int rank, int size, std::string name, std::chrono::milliseconds timeout)
    : rank_(rank),
      size_(size),
      name_(std::move(name)),
      timeout_(timeout),
      counters_(std::make_shared<Counters>()) {
  FSDP_CHECK(size >= 1, "process group '", name_, "' needs at least one rank, got size ", size);
  FSDP_CHECK(rank >= 0 && rank < size, "process group '", name_, "': rank ", rank,
             " is outside [0, ", size, ")");
  FSDP_CHECK(timeout.count() > 0, "process group '", name_, "': timeout must be positive, got ",
             timeout.count(), " ms");
}

CommCounters ProcessGroup::counters() const {
  std::lock_guard<std::mutex> lock(counters_->mu);
  return counters_->c;
}

void ProcessGroup::reset_counters() {
  std::lock_guard<std::mutex> lock(counters_->mu);
  counters_->c = CommCounters{};
}

namespace {

void check_tensor(const ProcessGroup& pg, const char* op, const char* what, const at::Tensor& t) {
  FSDP_CHECK(t.defined(), op, " on group '", pg.name(), "': ", what, " is undefined");
  FSDP_CHECK(t.device() == pg.device(), op, " on group '", pg.name(), "': ", what, " is on ",
             t.device(), " but the ", pg.backend(), " group expects tensors on ", pg.device(),
             " — move it with .to(", pg.device(), ")");
  FSDP_CHECK(t.is_contiguous(), op, " on group '", pg.name(), "': ", what, " (", describe(t),
             ") is not contiguous — pass .contiguous() or a flat buffer");
  FSDP_CHECK(is_supported_dtype(t.scalar_type()), op, " on group '", pg.name(), "': ", what,
             " has dtype ", t.scalar_type(),
             ", which is not supported (float32, float64, bfloat16, float16, int8/16/32/64, uint8, bool)");
}

void check_same_kind(const ProcessGroup& pg, const char* op, const at::Tensor& out,
                     const at::Tensor& in) {
  FSDP_CHECK(out.scalar_type() == in.scalar_type(), op, " on group '", pg.name(),
             "': out and in must have the same dtype, got out ", describe(out), " and in ",
             describe(in));
}

void check_reduction(const ProcessGroup& pg, const char* op, const at::Tensor& t, ReduceOp rop) {
  FSDP_CHECK(t.scalar_type() != at::kBool, op, " on group '", pg.name(),
             "': reductions over bool tensors are not supported — convert to uint8 first");
  FSDP_CHECK(rop != ReduceOp::kAvg || at::isFloatingType(t.scalar_type()), op, " on group '",
             pg.name(), "': ReduceOp::kAvg needs a floating-point tensor, got ", t.scalar_type(),
             " — use kSum and divide, or convert to float");
}

}  // namespace

// The logical buffer of a collective, or 0 in a group of one rank, where
// nothing crosses the wire.
ProcessGroup::NewGroupPlan ProcessGroup::plan_new_group(const std::vector<int>& ranks, const std::string& tag) {
  FSDP_CHECK(!ranks.empty(), "new_group('", tag, "') on group '", name(), "': ranks is empty");
  std::ostringstream list;
  int my_index = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    FSDP_CHECK(ranks[i] >= 0 && ranks[i] < size(), "new_group('", tag, "') on group '", name(),
               "': rank ", ranks[i], " is not a rank of this group of size ", size());
    FSDP_CHECK(i == 0 || ranks[i] > ranks[i - 1], "new_group('", tag, "') on group '", name(),
               "': ranks must be strictly increasing, got ", ranks[i - 1], " then ", ranks[i]);
    if (ranks[i] == rank()) my_index = static_cast<int>(i);
    list << (i ? "," : "") << ranks[i];
  }
  FSDP_CHECK(!tag.empty() && tag.find('/') == std::string::npos, "new_group on group '", name(),
             "': tag '", tag, "' must be non-empty and contain no '/'");
  FSDP_CHECK(my_index >= 0, "new_group('", tag, "') on group '", name(), "': rank ", rank(),
             " is not in ranks [", list.str(), "] — only members may call new_group");
  int count;
  {
    std::lock_guard<std::mutex> lock(new_group_mu_);
    count = new_group_count_[tag + "/" + list.str()]++;
  }
  return {my_index, static_cast<int>(ranks.size()), detail::cat("group/", tag, "/", list.str(), "/", count)};
}

int64_t ProcessGroup::wire_bytes(const at::Tensor& t) const {
  return size_ > 1 ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

WorkPtr ProcessGroup::all_gather(const at::Tensor& out, const at::Tensor& in) {
  static constexpr const char* kOp = "all_gather";
  check_tensor(*this, kOp, "out", out);
  check_tensor(*this, kOp, "in", in);
  check_same_kind(*this, kOp, out, in);
  FSDP_CHECK(out.numel() == static_cast<int64_t>(size_) * in.numel(), kOp, " on group '", name_,
             "': out must hold size() * in.numel() = ", size_, " * ", in.numel(), " = ",
             static_cast<int64_t>(size_) * in.numel(), " elements, got ", out.numel());
  if (overlaps(out, in)) {
    const auto* chunk = static_cast<const char*>(out.data_ptr()) +
                        static_cast<int64_t>(rank_) * in.numel() * in.element_size();
    FSDP_CHECK(in.data_ptr() == chunk, kOp, " on group '", name_,
               "': in overlaps out but is not out's chunk ", rank_,
               " — in-place all_gather needs in == out.narrow(0, rank() * n, n)");
  }
  {
    std::lock_guard<std::mutex> lock(counters_->mu);
    counters_->c.allgather_bytes += wire_bytes(out);
    counters_->c.allgather_calls += 1;
  }
  return do_all_gather(out, in);
}

WorkPtr ProcessGroup::reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op) {
  static constexpr const char* kOp = "reduce_scatter";
  check_tensor(*this, kOp, "out", out);
  check_tensor(*this, kOp, "in", in);
  check_same_kind(*this, kOp, out, in);
  check_reduction(*this, kOp, in, op);
  FSDP_CHECK(in.numel() == static_cast<int64_t>(size_) * out.numel(), kOp, " on group '", name_,
             "': in must hold size() * out.numel() = ", size_, " * ", out.numel(), " = ",
             static_cast<int64_t>(size_) * out.numel(), " elements, got ", in.numel(),
             " — pad the input to a multiple of the group size");
  FSDP_CHECK(!overlaps(out, in), kOp, " on group '", name_,
             "': out overlaps in; reduce_scatter leaves in unchanged and needs a separate output "
             "buffer");
  {
    std::lock_guard<std::mutex> lock(counters_->mu);
    counters_->c.reduce_scatter_bytes += wire_bytes(in);
    counters_->c.reduce_scatter_calls += 1;
  }
  return do_reduce_scatter(out, in, op);
}

WorkPtr ProcessGroup::all_reduce(const at::Tensor& t, ReduceOp op) {
  static constexpr const char* kOp = "all_reduce";
  check_tensor(*this, kOp, "t", t);
  check_reduction(*this, kOp, t, op);
  {
    std::lock_guard<std::mutex> lock(counters_->mu);
    counters_->c.allreduce_bytes += wire_bytes(t);
    counters_->c.allreduce_calls += 1;
  }
  return do_all_reduce(t, op);
}

WorkPtr ProcessGroup::broadcast(const at::Tensor& t, int root) {
  static constexpr const char* kOp = "broadcast";
  check_tensor(*this, kOp, "t", t);
  FSDP_CHECK(root >= 0 && root < size_, kOp, " on group '", name_, "': root ", root,
             " is not a rank of this group of size ", size_, " (ranks are group-local)");
  {
    std::lock_guard<std::mutex> lock(counters_->mu);
    counters_->c.broadcast_bytes += wire_bytes(t);
    counters_->c.broadcast_calls += 1;
  }
  return do_broadcast(t, root);
}

WorkPtr ProcessGroup::all_to_all(const at::Tensor& out, const at::Tensor& in) {
  static constexpr const char* kOp = "all_to_all";
  check_tensor(*this, kOp, "out", out);
  check_tensor(*this, kOp, "in", in);
  check_same_kind(*this, kOp, out, in);
  FSDP_CHECK(out.numel() == in.numel() && in.numel() % size_ == 0, kOp, " on group '", name_,
             "': in and out must hold the same multiple of size() = ", size_, " elements, got in ", describe(in),
             " and out ", describe(out));
  FSDP_CHECK(!overlaps(out, in), kOp, " on group '", name_, "': out overlaps in; use separate buffers");
  {
    std::lock_guard<std::mutex> lock(counters_->mu);
    counters_->c.alltoall_bytes += wire_bytes(in);
    counters_->c.alltoall_calls += 1;
  }
  return do_all_to_all(out, in);
}

WorkPtr ProcessGroup::do_all_to_all(const at::Tensor&, const at::Tensor&) {
  FSDP_CHECK(false, "all_to_all on group '", name_, "': the ", backend(),
             " backend has no all_to_all (the compressed reduce-scatter needs one) — use the tcp group (CPU)");
  return nullptr;
}

HybridGroups make_hybrid_groups(ProcessGroup& world, int shard_size) {
  const int w = world.size();
  FSDP_CHECK(shard_size >= 1 && shard_size <= w && w % shard_size == 0,
             "make_hybrid_groups on group '", world.name(), "': shard size ", shard_size,
             " must divide the group size ", w,
             " — use the number of ranks per node (LOCAL_WORLD_SIZE) or another divisor of ", w);
  const int r = world.rank();
  const int block = r / shard_size;
  const int pos = r % shard_size;
  std::vector<int> shard_ranks;
  for (int i = 0; i < shard_size; ++i) shard_ranks.push_back(block * shard_size + i);
  std::vector<int> replicate_ranks;
  for (int b = 0; b < w / shard_size; ++b) replicate_ranks.push_back(b * shard_size + pos);
  // Every rank creates its shard group first, then its replicate group, so the
  // blocking rendezvous of each group sees all of its members.
  HybridGroups g;
  g.shard = world.new_group(shard_ranks, "shard");
  g.replicate = world.new_group(replicate_ranks, "replicate");
  return g;
}

}  // namespace fsdp::comm
