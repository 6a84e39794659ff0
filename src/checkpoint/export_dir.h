// The machinery every model-directory export shares (export_hf,
// export_peft_adapter): the plan of files, a temporary directory beside DIR
// that replaces DIR when complete (Note [Checkpoint commit] in sharded.h),
// the lock, each unit entry gathered in turn, rank 0 writing, and one
// agreement on the outcome. What differs between exports is an ExportSpec.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/hf.h"

namespace fsdp::checkpoint::detail {

struct ExportSpec {
  std::string flag;  // what names DIR in messages ("export_hf: dir")
  std::string what;  // what is exported, in the failure message ("Hugging Face weights")
  at::ScalarType dtype = at::kFloat;
  int64_t max_shard_bytes = 0;  // <= 0: one file, single_name
  std::string single_name;      // the weights' file when not split (split: model-0000i-of-0000N + index)
  // The name a parameter is written under; "" leaves it out. Unit entries
  // with nothing written are not gathered.
  std::function<std::string(const std::string& param)> tensor_name;
  // The values written for a parameter (null: the gathered values as they are).
  std::function<at::Tensor(const std::string& param, const at::Tensor& value)> value_of;
  // Written into DIR after the weights, as they are: (file name, content).
  std::vector<std::pair<std::string, std::string>> text_files;
  // Copied into DIR: (source path, file name).
  std::vector<std::pair<std::string, std::string>> copied_files;
  // The names this export writes: DIR may hold only those (check_export_dir).
  std::function<bool(const std::string& file_name)> is_export_file;
  bool progress = false;
};

// Collective over `group`; rank 0 writes. Errors are raised on every rank.
HfExportResult export_dir(const std::string& dir, ShardedModel& model, comm::ProcessGroup& group,
                          const ExportSpec& spec);

// check_export_dir with the export's own file names.
void check_export_dir_of(const std::string& dir, const std::string& flag,
                         const std::function<bool(const std::string&)>& is_export_file);

}  // namespace fsdp::checkpoint::detail
