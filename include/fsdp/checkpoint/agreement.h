// Cross-rank agreement for the collective decisions of checkpointing and
// export: every rank reports what it found (a typed status, with data when it
// succeeded), every rank receives every report, and every rank decides the
// same way from the same reports — so either all ranks go on or all raise the
// same error, and no rank is left waiting in a collective the others skipped.
//
//   RankStatus mine = RankStatus::capture([&] { write_my_file(); });
//   Agreement all = agree(group, mine);               // collective
//   all.raise_if_failed("saving checkpoint X failed");  // the same on every rank
//
// Precedence when several ranks report problems: a usage error (bad input:
// exit code 2) before a damaged file before a failure, the lowest rank first
// within a kind.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "fsdp/comm/process_group.h"

namespace fsdp::checkpoint {

struct RankStatus {
  enum class Kind {
    kOk,       // nothing went wrong; `payload` carries this rank's data (may be empty)
    kFailure,  // a runtime failure (I/O, a full disk): fsdp::Failure, exit code 1
    kDamaged,  // a checkpoint file failed its checks: DamagedCheckpoint naming `file`
    kUsage,    // bad input or a refusal: fsdp::UsageError, exit code 2
  };
  Kind kind = Kind::kOk;
  std::string message;  // without the "[rank r/W]" tag (another rank re-raises it with its own)
  std::string file;     // kDamaged: the file named in the message
  std::string payload;  // kOk: data for the other ranks

  bool ok() const { return kind == Kind::kOk; }
  // `payload` as the JSON a rank of this job made it from (this program's own text, not a file's).
  nlohmann::json payload_json() const;
  static RankStatus success(std::string payload = {});
  static RankStatus failure(std::string message);
  // The kind of `e` (UsageError, DamagedCheckpoint, else failure), its message without the rank tag.
  static RankStatus of(const std::exception& e);
  // Runs `fn`; what it throws (any std::exception) becomes the status.
  static RankStatus capture(const std::function<void()>& fn);
};
const char* to_string(RankStatus::Kind k);

// Every rank's report and the decision they imply (identical on every rank).
class Agreement {
 public:
  explicit Agreement(std::vector<RankStatus> ranks);

  const std::vector<RankStatus>& ranks() const { return ranks_; }
  bool ok() const { return deciding_ < 0; }
  // The report that decides (see the precedence above), and its rank.
  // Requires: !ok().
  const RankStatus& decision() const;
  int deciding_rank() const { return deciding_; }

  // When !ok(), throws on every rank: the deciding usage error as a
  // UsageError with its message; else a Failure "<what>: rank r: ...; rank s:
  // ..." listing every rank that did not succeed (a damaged file included).
  void raise_if_failed(const std::string& what) const;

 private:
  std::vector<RankStatus> ranks_;
  int deciding_ = -1;
};

// Collective over `group`: every rank's status, on every rank.
Agreement agree(comm::ProcessGroup& group, const RankStatus& mine);

// Strings from every rank, indexed by rank (collective over `group`): the
// exchange agree() is built on, for data that is not a decision.
std::vector<std::string> all_gather_strings(comm::ProcessGroup& group, const std::string& mine);

// "[rank 1/2] text" -> "text".
std::string strip_rank_tag(const std::string& message);

}  // namespace fsdp::checkpoint
