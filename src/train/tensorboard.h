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
// A resumed run opens a new file whose first event after the version is a
// SessionLog START at the resumed step: TensorBoard's EventAccumulator then
// drops the older files' points at or after that step (they were trained
// again), so a curve has each step once. (TensorBoard's fast Rust loader
// ignores SessionLog but drops, per tag, older points at or after a new
// point's step: the same curves.) A file name's seconds are past those of
// every event file already in DIR, so the new file sorts last.
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
  // the SessionLog START described above. Failure naming DIR otherwise.
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
