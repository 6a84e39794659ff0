#include "train/profiling.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <vector>

#include "fsdp/checkpoint/agreement.h"
#include "fsdp/common/output_file.h"
#include "fsdp/common/trace.h"

namespace fsdp::train {
namespace {

// Chrome trace events of one rank (pid = rank, one tid per thread).
nlohmann::json trace_events_json(const std::vector<trace::Event>& events, int rank) {
  nlohmann::json out = nlohmann::json::array();
  out.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", rank}, {"args", {{"name", fmt::format("rank {}", rank)}}}});
  out.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", rank}, {"args", {{"sort_index", rank}}}});
  std::vector<bool> used;
  for (const trace::Event& e : events) {
    nlohmann::json args = nlohmann::json::object();
    if (e.bytes >= 0) args["bytes"] = e.bytes;
    if (e.step >= 0) args["step"] = e.step;
    if (!e.detail.empty()) args[e.cat == "comm" && e.name.find(' ') == std::string::npos ? "what" : "unit"] = e.detail;
    out.push_back({{"ph", "X"}, {"name", e.name}, {"cat", e.cat}, {"ts", e.begin_us}, {"dur", e.dur_us},
                   {"pid", rank}, {"tid", e.thread}, {"args", args}});
    if (used.size() <= static_cast<size_t>(e.thread)) used.resize(static_cast<size_t>(e.thread) + 1);
    used[static_cast<size_t>(e.thread)] = true;
  }
  const std::vector<std::string> names = trace::thread_names();
  for (size_t t = 0; t < used.size() && t < names.size(); ++t) {
    if (!used[t]) continue;
    out.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", t}, {"args", {{"name", names[t]}}}});
    // The training thread first, then the lanes.
    out.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", rank}, {"tid", t},
                   {"args", {{"sort_index", names[t] == "main" ? 0 : static_cast<int>(t) + 1}}}});
  }
  return out;
}

// One line per traced step from this rank's spans: where its time went and
// how much communication it waited for.
std::string profile_summary(const std::vector<trace::Event>& events, const trace::Event& step) {
  const int64_t b = step.begin_us, e = step.begin_us + step.dur_us;
  std::vector<trace::Event> in;  // clipped to the step
  for (const trace::Event& x : events) {
    const int64_t xb = std::max(x.begin_us, b), xe = std::min(x.begin_us + x.dur_us, e);
    if (xe <= xb || x.cat == "step") continue;
    trace::Event c = x;
    c.begin_us = xb;
    c.dur_us = xe - xb;
    in.push_back(std::move(c));
  }
  const int main = step.thread;
  auto ms = [&](auto keep) { return static_cast<double>(trace::covered_us(in, keep)) / 1e3; };
  const double forward = ms([&](const trace::Event& x) { return x.thread == main && x.name == "forward"; });
  const double backward = ms([&](const trace::Event& x) { return x.thread == main && x.name == "backward"; });
  const double optimizer = ms([&](const trace::Event& x) { return x.thread == main && x.cat == "optim"; });
  const double data = ms([&](const trace::Event& x) { return x.thread == main && x.cat == "data"; });
  const double exposed = ms([&](const trace::Event& x) { return x.thread == main && x.cat == "comm"; });
  const double lanes = ms([&](const trace::Event& x) { return x.thread != main && x.cat == "comm"; });
  const double total = static_cast<double>(step.dur_us) / 1e3;
  return fmt::format("Profile step {}: {:.1f} ms (rank 0): forward {:.1f} ms, backward {:.1f} ms, optimizer {:.1f} "
                     "ms, data wait {:.1f} ms; communication {:.1f} ms on the lanes, exposed {:.1f} ms ({:.0f}% of "
                     "the step)",
                     step.step, total, forward, backward, optimizer, data, lanes, exposed,
                     total > 0 ? 100.0 * exposed / total : 0.0);
}

}  // namespace

// Note [Traced steps]
// --profile-steps A:B traces steps A..B-1 on every rank (common/trace.h):
// the training thread's spans (step, data wait, each unit's forward and
// backward, gradient-free recomputation, the issue and the wait of each
// unit's all-gather and reduce-scatter, the optimizer, evaluation and
// checkpoint saves) and each collective lane's own spans, with bytes. The
// lanes run the collectives beside compute, so what a step waited for is
// the union of the training thread's "comm" spans: the exposed
// communication of the summary line. After step B-1 (or the last step run)
// the ranks' events are gathered to rank 0, which writes one file with one
// track group per rank (pid = rank).
void StepTracer::start_if_due(int64_t step) {
  const bool profiling = log_.profile_end > log_.profile_begin;
  if (profiling && !tracing_ && step >= log_.profile_begin && step < log_.profile_end) {
    trace::start();
    tracing_ = true;
  }
}

std::string StepTracer::finish(comm::ProcessGroup& group, const std::string& model_name, int64_t first,
                               int64_t last, const LogLine& say) {
  tracing_ = false;
  const std::vector<trace::Event> events = trace::stop();
  const std::vector<std::string> all =
      checkpoint::all_gather_strings(group, trace_events_json(events, group.rank()).dump());
  if (group.rank() != 0) return "";
  for (const trace::Event& e : events) {
    if (e.cat == "step" && e.thread == trace::this_thread()) say(profile_summary(events, e));
  }
  nlohmann::json merged = nlohmann::json::array();
  size_t spans = 0;
  for (const std::string& r : all) {
    for (auto& e : nlohmann::json::parse(r)) {
      spans += e["ph"] == "X" ? 1 : 0;
      merged.push_back(std::move(e));
    }
  }
  const int W = group.size();
  const nlohmann::json file = {
      {"traceEvents", std::move(merged)},
      {"displayTimeUnit", "ms"},
      {"otherData", {{"producer", "fsdp-train"}, {"steps", fmt::format("{}:{}", log_.profile_begin,
                                                                        log_.profile_end)},
                     {"world_size", W}, {"model", model_name}}}};
  write_output_file(log_.profile_file, file.dump(), "LogOptions::profile_file");
  say(fmt::format("Wrote trace of steps {}..{} ({} spans, {} rank{}) to {}: open it in ui.perfetto.dev or "
                  "chrome://tracing", first, last, spans, W, W == 1 ? "" : "s", log_.profile_file));
  return log_.profile_file;
}

}  // namespace fsdp::train
