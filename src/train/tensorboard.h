// TensorBoard event files written natively (--tensorboard DIR): no protobuf
// library, no Python. Rank 0 writes one file per run,
//   DIR/events.out.tfevents.<unix seconds>.<host>.<pid>
// in TFRecord framing (length, masked CRC-32C of the length, the serialized
// Event, masked CRC-32C of the Event), holding tensorflow.Event protos with
// only the fields TensorBoard reads for scalars:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3;
//             Summary summary = 5; SessionLog session_log = 7; }
//   Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
//   SessionLog { Status status = 1; }       (START = 1)
//
// Note [TensorBoard after a resume]
// A run resumed from the checkpoint of step S trains steps S, S+1, ... again,
// and the interrupted run may have logged some of them: the files already in
// DIR hold points that the resumed run replaces. A curve must show each step
// once, with the values of the run that continues (as the metrics file does,
// Note [Metrics after a resume]). The earlier files are left as they are; the
// resumed run opens a new file whose first event after the file version is a
// SessionLog START at step S (Event field 7; field 6 is the deprecated
// log_message, which nothing reads). TensorBoard's two loaders act on it:
//  - the Python one (EventAccumulator with purge_orphaned_data=True, its
//    default; `tensorboard --load_fast=false`) drops every point of every tag
//    at step >= S read before the START: the crashed run's steps S.. and also
//    the evaluation logged at step S by the run that saved the checkpoint
//    (the metrics file drops that record too);
//  - the Rust data server (what --load_fast=auto picks where the
//    tensorboard-data-server package is installed) ignores SessionLog and
//    drops, per tag, the older points at steps >= a new point's step: the
//    same train/* curves, with the evaluation at S kept.
// Both read a directory's files in the order of their names,
// events.out.tfevents.<unix seconds>.<host>.<pid>: a resumed run started
// within the same second as the run before it could sort first (pids compare
// as text) and then purge nothing. So the new file's seconds are past those of
// every event file already in DIR, and it sorts last.
// tests/observe/test_observability.py reads the files back with
// EventAccumulator and requires each train/* step once.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::train {

class TensorBoardWriter {
 public:
  // Creates DIR if needed and the event file in it. `resumed_at` >= 0 writes
  // the SessionLog START at that step (Note [TensorBoard after a resume]).
  // Failure naming DIR otherwise.
  TensorBoardWriter(const std::string& dir, int64_t resumed_at);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One event holding every (tag, value) pair at `step`, flushed to the file
  // (TensorBoard shows it while the run goes on).
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);

  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& event);
  std::string dir_;
  std::string path_;
  std::FILE* file_ = nullptr;
};

// The serialized Event of `scalars` (tests read it back).
std::string tensorboard_scalar_event(double wall_time, int64_t step,
                                     const std::vector<std::pair<std::string, double>>& values);

}  // namespace fsdp::train
