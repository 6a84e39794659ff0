#include "fsdp/checkpoint/async_save.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <thread>

#include "file_io.h"
#include "fsdp/common/device.h"
#include "fsdp/common/error.h"
#include "fsdp/common/memory.h"
#include "fsdp/common/trace.h"
#include "save_job.h"

namespace fsdp::checkpoint {

// ---- the lifecycle --------------------------------------------------------------------

const char* to_string(AsyncSaveState s) {
  switch (s) {
    case AsyncSaveState::kIdle: return "kIdle";
    case AsyncSaveState::kWriting: return "kWriting";
    case AsyncSaveState::kWritten: return "kWritten";
    case AsyncSaveState::kCommitting: return "kCommitting";
  }
  return "?";
}

bool legal(AsyncSaveState from, AsyncSaveState to) {
  using S = AsyncSaveState;
  switch (from) {
    case S::kIdle: return to == S::kWriting;                       // start()
    case S::kWriting: return to == S::kWritten;                    // the writer ended (seen by poll/finish/start)
    case S::kWritten: return to == S::kCommitting;                 // every rank's writer ended
    case S::kCommitting: return to == S::kIdle;                    // committed, or the agreed error raised
  }
  return false;
}

void AsyncCheckpointer::transition_to(AsyncSaveState to, const char* what) {
  FSDP_ASSERT(legal(state_, to), "asynchronous checkpoint save: illegal state change ", to_string(state_), " -> ",
              to_string(to), " in ", what);
  state_ = to;
}

struct AsyncCheckpointer::Pool {
  StagingPool staging;
};

struct AsyncCheckpointer::InFlight {
  SaveJob job;
  double started = 0;             // when start() began
  std::future<RankStatus> ended;  // the writer's result
  std::thread writer;             // not joinable when written inline
  std::optional<RankStatus> written;

  ~InFlight() {
    if (writer.joinable()) writer.join();
  }
};

AsyncCheckpointer::AsyncCheckpointer(AsyncSaveOptions options)
    : options_(options), pool_(std::make_unique<Pool>()) {
  FSDP_CHECK(options_.staging_limit >= 0, "the checkpoint staging limit must be >= 0 bytes, got ",
             options_.staging_limit);
}

AsyncCheckpointer::~AsyncCheckpointer() = default;  // InFlight joins the writer

int64_t AsyncCheckpointer::in_flight_step() const { return in_flight_ ? in_flight_->job.step : -1; }

int64_t AsyncCheckpointer::staging_bytes() const { return pool_->staging.bytes(); }

bool AsyncCheckpointer::writer_ended() {
  if (state_ == AsyncSaveState::kWriting &&
      in_flight_->ended.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
    in_flight_->written = in_flight_->ended.get();
    transition_to(AsyncSaveState::kWritten, "the writer ended");
  }
  return state_ == AsyncSaveState::kWritten;
}

AsyncStart AsyncCheckpointer::start(const std::string& dir, int64_t step, ShardedModel& model,
                                    const std::vector<StateOwner*>& owners, comm::ProcessGroup& group,
                                    const SaveOptions& options) {
  const double t0 = io::now_seconds();
  AsyncStart out;
  if (state_ != AsyncSaveState::kIdle) out.waited_for = finish(group);  // at most one save in flight
  SaveOptions so = options;
  so.progress = false;  // no progress bar from the writer thread
  auto f = std::make_unique<InFlight>();
  f->started = t0;
  f->job = begin_save(dir, step, model, owners, group, so);
  out.path = f->job.final;
  out.state_bytes = f->job.stager->bytes();

  // Stage, or say why not (Note [Asynchronous save]).
  const int64_t reusable = pool_->staging.bytes();
  const HostMemory host = host_memory();
  if (out.state_bytes > options_.staging_limit) {
    out.not_staged = fmt::format("{} to save on this rank exceeds the staging limit {} (AsyncSaveOptions::staging_limit)",
                                 format_bytes(out.state_bytes), format_bytes(options_.staging_limit));
  } else if (host.available >= 0 && out.state_bytes - reusable > host.available / 2) {
    out.not_staged = fmt::format("staging {} more would take over half of the host memory available ({}, {})",
                                 format_bytes(out.state_bytes - reusable), format_bytes(host.available), host.bound);
  }
  out.staged = out.not_staged.empty();
  std::promise<RankStatus> promise;
  f->ended = promise.get_future();
  if (out.staged) {
    const double s0 = io::now_seconds();
    {
      trace::Span span("checkpoint staging", "checkpoint", out.state_bytes, {}, step);
      RankStatus copied = RankStatus::capture([&] { f->job.stager->copy(pool_->staging); });
      if (!copied.ok()) {  // out of memory: nothing written yet; the ranks agree in the commit
        promise.set_value(copied);
        out.staged = false;
        out.not_staged = "copying into host memory failed: " + copied.message;
      }
    }
    out.stage_s = io::now_seconds() - s0;
    if (out.staged) {
      f->writer = std::thread([write = f->job.write, promise = std::move(promise), step]() mutable {
        trace::set_thread_name("checkpoint writer");
        RankStatus r;
        {
          trace::Span span("checkpoint write", "checkpoint", -1, {}, step);
          try {
            r = write();
          } catch (const std::exception& e) {  // write() reports failures itself; this is a last resort
            r = RankStatus::of(e);
          }
        }
        promise.set_value(std::move(r));
      });
    }
  } else {
    promise.set_value(f->job.write());  // synchronous: the live tensors are read before the step goes on
  }
  in_flight_ = std::move(f);
  transition_to(AsyncSaveState::kWriting, "start");
  out.staging_bytes = pool_->staging.bytes();
  out.stall_s = io::now_seconds() - t0;
  return out;
}

std::optional<AsyncCommit> AsyncCheckpointer::poll(comm::ProcessGroup& group) {
  if (state_ == AsyncSaveState::kIdle) return std::nullopt;
  const bool ended = writer_ended();
  const double failed = ended && !in_flight_->written->ok() ? 1 : 0;
  at::Tensor t = at::tensor({ended ? 1.0 : 0.0, failed}, at::TensorOptions().dtype(at::kDouble));
  if (group.size() > 1) group.all_reduce(t, comm::ReduceOp::kSum)->wait();
  const bool all_ended = t[0].item<double>() == static_cast<double>(group.size());
  const bool any_failed = t[1].item<double>() > 0;
  if (!all_ended && !any_failed) return std::nullopt;
  return commit(group);  // a failure surfaces now, on every rank
}

std::optional<AsyncCommit> AsyncCheckpointer::finish(comm::ProcessGroup& group) {
  if (state_ == AsyncSaveState::kIdle) return std::nullopt;
  return commit(group);
}

AsyncCommit AsyncCheckpointer::commit(comm::ProcessGroup& group) {
  // Wait for this rank's writer (the others' are waited for by the agreement).
  if (state_ == AsyncSaveState::kWriting) {
    in_flight_->written = in_flight_->ended.get();
    transition_to(AsyncSaveState::kWritten, "commit");
  }
  if (in_flight_->writer.joinable()) in_flight_->writer.join();
  transition_to(AsyncSaveState::kCommitting, "commit");
  std::unique_ptr<InFlight> f = std::move(in_flight_);
  const double c0 = io::now_seconds();
  AsyncCommit out;
  out.step = f->job.step;
  try {
    trace::Span span("checkpoint commit", "checkpoint", -1, {}, f->job.step);
    out.result = commit_save(f->job, *f->written, group);
  } catch (...) {
    transition_to(AsyncSaveState::kIdle, "commit (failed)");
    throw;
  }
  transition_to(AsyncSaveState::kIdle, "commit");
  out.commit_s = io::now_seconds() - c0;
  out.result.io.seconds = io::now_seconds() - f->started;
  return out;
}

}  // namespace fsdp::checkpoint
