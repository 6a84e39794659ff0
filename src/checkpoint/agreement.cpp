#include "fsdp/checkpoint/agreement.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>

#include "fsdp/checkpoint/types.h"
#include "fsdp/common/error.h"

namespace fsdp::checkpoint {

namespace {

// The precedence of a kind among problems; 0 for kOk.
int precedence(RankStatus::Kind k) {
  switch (k) {
    case RankStatus::Kind::kOk: return 0;
    case RankStatus::Kind::kFailure: return 1;
    case RankStatus::Kind::kDamaged: return 2;
    case RankStatus::Kind::kUsage: return 3;
  }
  return 0;
}

}  // namespace

nlohmann::json RankStatus::payload_json() const { return nlohmann::json::parse(payload); }

namespace {

std::string encode(const RankStatus& s) {
  return nlohmann::json{{"kind", static_cast<int>(s.kind)}, {"message", s.message}, {"file", s.file},
                        {"payload", s.payload}}
      .dump();
}

RankStatus decode(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text);
  RankStatus s;
  const int kind = j.at("kind").get<int>();
  FSDP_ASSERT(kind >= 0 && kind <= static_cast<int>(RankStatus::Kind::kUsage), "status kind ", kind);
  s.kind = static_cast<RankStatus::Kind>(kind);
  s.message = j.at("message").get<std::string>();
  s.file = j.at("file").get<std::string>();
  s.payload = j.at("payload").get<std::string>();
  return s;
}

}  // namespace

std::string strip_rank_tag(const std::string& m) {
  if (m.rfind("[rank ", 0) == 0) {
    const size_t e = m.find("] ");
    if (e != std::string::npos) return m.substr(e + 2);
  }
  return m;
}

const char* to_string(RankStatus::Kind k) {
  switch (k) {
    case RankStatus::Kind::kOk: return "ok";
    case RankStatus::Kind::kFailure: return "failure";
    case RankStatus::Kind::kDamaged: return "damaged";
    case RankStatus::Kind::kUsage: return "usage error";
  }
  return "?";
}

RankStatus RankStatus::success(std::string payload) {
  RankStatus s;
  s.payload = std::move(payload);
  return s;
}

RankStatus RankStatus::failure(std::string message) {
  RankStatus s;
  s.kind = Kind::kFailure;
  s.message = message.empty() ? std::string("an error without a message") : std::move(message);
  return s;
}

RankStatus RankStatus::of(const std::exception& e) {
  RankStatus s = failure(strip_rank_tag(e.what()));
  if (dynamic_cast<const UsageError*>(&e) != nullptr) s.kind = Kind::kUsage;
  if (const auto* d = dynamic_cast<const DamagedCheckpoint*>(&e)) {
    s.kind = Kind::kDamaged;
    s.file = d->file();
  }
  return s;
}

RankStatus RankStatus::capture(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return of(e);
  }
  return success();
}

Agreement::Agreement(std::vector<RankStatus> ranks) : ranks_(std::move(ranks)) {
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const int p = precedence(ranks_[r].kind);
    if (p > 0 && (deciding_ < 0 || p > precedence(ranks_[static_cast<size_t>(deciding_)].kind))) {
      deciding_ = static_cast<int>(r);
    }
  }
}

const RankStatus& Agreement::decision() const {
  FSDP_ASSERT(deciding_ >= 0, "Agreement::decision when every rank succeeded");
  return ranks_[static_cast<size_t>(deciding_)];
}

void Agreement::raise_if_failed(const std::string& what) const {
  if (ok()) return;
  if (decision().kind == RankStatus::Kind::kUsage) detail::throw_usage(decision().message);
  std::string failures;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (ranks_[r].ok()) continue;
    failures += detail::cat(failures.empty() ? "" : "; ", "rank ", r, ": ", ranks_[r].message);
  }
  FSDP_FAIL(what, ": ", failures);
}

Agreement agree(comm::ProcessGroup& group, const RankStatus& mine) {
  std::vector<RankStatus> all;
  for (const std::string& s : all_gather_strings(group, encode(mine))) all.push_back(decode(s));
  return Agreement(std::move(all));
}

std::vector<std::string> all_gather_strings(comm::ProcessGroup& group, const std::string& mine) {
  const int w = group.size();
  if (w == 1) return {mine};
  at::Tensor len = at::full({1}, static_cast<int64_t>(mine.size()), at::kLong);
  at::Tensor lens = at::empty({w}, at::kLong);
  group.all_gather(lens, len)->wait();
  int64_t max_len = 1;
  for (int r = 0; r < w; ++r) max_len = std::max(max_len, lens[r].item<int64_t>());
  at::Tensor in = at::zeros({max_len}, at::kByte);
  if (!mine.empty()) std::memcpy(in.data_ptr(), mine.data(), mine.size());
  at::Tensor out = at::empty({max_len * w}, at::kByte);
  group.all_gather(out, in)->wait();
  std::vector<std::string> all(static_cast<size_t>(w));
  const auto* p = static_cast<const char*>(out.data_ptr());
  for (int r = 0; r < w; ++r) all[static_cast<size_t>(r)].assign(p + r * max_len, static_cast<size_t>(lens[r].item<int64_t>()));
  return all;
}

}  // namespace fsdp::checkpoint
