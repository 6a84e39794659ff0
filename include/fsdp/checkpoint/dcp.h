// PyTorch Distributed Checkpoint (DCP) directories: read and written by
// every rank in parallel, with no Python at run time.
//
// What PyTorch 2.11 writes (torch.distributed.checkpoint, FileSystemWriter,
// the default "torch_save" format) and these functions read and write:
//   DIR/.metadata        a pickle (protocol 4) of DCP's Metadata dataclass:
//                        each tensor's dtype, size and chunks (n-D boxes), and
//                        where each item lies (checkpoint/pickle.h reads it:
//                        Note [Restricted pickle])
//   DIR/__R_N.distcp     the items rank R wrote, back to back: each a complete
//                        torch.save archive (a zip) of one chunk, or of one
//                        non-tensor value (a float, a tuple, a list of names)
// and the "safetensors" format of torch.distributed.checkpoint.hf_storage
// (HuggingFaceStorageWriter(save_distributed=True)): DIR/shard-0000R-model-
// 00001-of-00001.safetensors per rank, each chunk a tensor of the file named
// by its key (the model's own names, as get_model_state_dict gives them, and
// optimizer.state.<name>.<kind>), its offsets in the header's "DCP_SHARDING_INFO";
// no .metadata.
//
// Note [DCP keys]. A state dict saved by dcp.save is flattened: nested
// dicts join with ".", list indices are numbers. The layouts understood:
//   torch       what FSDP2 with torch.distributed.checkpoint.state_dict's
//               get_state_dict gives for {"model": ..., "optimizer": ...}:
//               model.<our name> (our names are Hugging Face's), and
//               optimizer.state.<name>.{exp_avg, exp_avg_sq, step},
//               optimizer.param_groups.0.{lr, betas, eps, weight_decay, ...,
//               params}; a model-only checkpoint has <our name> at the top.
//   torchtitan  torchtitan's CheckpointManager (torchtitan's checkpoint module):
//               model.<titan name> (tok_embeddings.weight,
//               layers.N.attention.wq.weight, feed_forward.w1/w2/w3,
//               attention_norm, ffn_norm, norm, output) with wq/wk rows in
//               Meta's interleaved-rotary order (permuted to ours on read,
//               back on write), optimizer.state.<titan name>.* and
//               optimizer.param_groups.<titan name>.* (flatten_optimizer_state_dict),
//               train_state.step (int32).
// Every slot of the StateOwners (Note [State seam]) is saved as
// optimizer.state.<name>.<kind> (AdamW's exp_avg, exp_avg_sq are PyTorch's
// names; SGD's momentum_buffer too), element-wise aligned with the parameter.
// The owners' metadata travel as one non-tensor item, "fsdp_cpp.state" (a
// JSON string), which PyTorch's dcp.load ignores unless asked for.
//
// Note [DCP resharding]. Each rank needs, of each parameter, the
// contiguous element range its flat shard covers; that range is a few n-D
// boxes, each intersected with the saved chunks; each intersection is read
// line by line (runs along the last dimension, merged where contiguous in
// both the file and the shard) from the item's data record, whose offset in
// the archive comes from the archive's directory. Only those bytes and the
// items' directories are read, at any world size.
//
// A checkpoint that cannot be used (truncated files, offsets outside a file,
// a foreign class in the pickle, a chunk of another shape than the metadata
// says) is a DamagedCheckpoint naming the checkpoint and the file; a
// checkpoint of another model (names or shapes) is a UsageError naming the
// parameter and both shapes.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fsdp/checkpoint/types.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/common/json_value.h"
#include "fsdp/common/state.h"
#include "fsdp/fsdp.h"

namespace fsdp::checkpoint {

// How keys are laid out (Note [DCP keys]).
enum class DcpLayout { kTorch, kTorchtitan };
// "torch" | "torchtitan"; UsageError naming `flag` otherwise.
DcpLayout parse_dcp_layout(const std::string& text, const std::string& flag);
// Chunk items: a torch.save archive each (DCP's default), or safetensors files.
enum class DcpFormat { kTorchSave, kSafetensors };
// "torch_save" | "safetensors"; UsageError naming `flag` otherwise.
DcpFormat parse_dcp_format(const std::string& text, const std::string& flag);

// Our parameter names as another program saves them: the name, and (for
// tensors whose rows another program orders differently) the saved row of
// each of our rows along the first dimension. The model family knows its
// names: a layout's adapter comes from the caller (for torchtitan's Llama,
// train::torchtitan_llama_names in family_llama.h).
struct DcpNames {
  std::function<std::string(const std::string& ours)> name;                 // null: the same
  std::function<int64_t(const std::string& ours, int64_t row, int64_t rows)> row;  // null: the same
};

// True when `dir` holds a DCP checkpoint (.metadata, or DCP safetensors files).
bool is_dcp_dir(const std::string& dir);
// The layout of the DCP checkpoint in `dir`, from its keys: kTorchtitan when
// one names torchtitan's embedding (tok_embeddings.weight), else kTorch.
// DamagedCheckpoint when its .metadata or headers cannot be read.
DcpLayout detect_dcp_layout(const std::string& dir);

struct DcpSaveOptions {
  DcpLayout layout = DcpLayout::kTorch;
  DcpFormat format = DcpFormat::kTorchSave;
  DcpNames names;         // required for kTorchtitan
  // save_dcp: copied by rank 0 into DIR/carried/ (Note [Carried files] in
  // src/checkpoint/carried.h); dcp.load reads only what .metadata names.
  std::vector<CarriedFile> carried;
};

// Writes the model's shards, the owners' slots (optimizer.state.<name>.<kind>)
// and metadata into the empty directory `dir`, every rank its own file; rank
// 0 writes .metadata last, after every rank's file is written and fsynced.
// The caller makes the directory visible atomically (save_dcp, or
// save_checkpoint with SaveOptions::format). Collective over `group`.
IoStats write_dcp_files(const std::string& dir, ShardedModel& model, const std::vector<StateOwner*>& owners,
                        comm::ProcessGroup& group, const DcpSaveOptions& options = {});
// UsageError naming `flag` unless DIR may receive save_dcp: not a symbolic
// link, and absent, empty or a directory this program wrote.
void check_dcp_target(const std::string& dir, const std::string& flag);
// write_dcp_files into DIR.tmp (owned, Note [Ownership of what we delete]),
// renamed to DIR when complete. DIR must not exist, or be a directory this
// program wrote (an export or a DCP save of its own): UsageError otherwise.
IoStats save_dcp(const std::string& dir, ShardedModel& model, const std::vector<StateOwner*>& owners,
                 comm::ProcessGroup& group, const DcpSaveOptions& options = {});

struct DcpLoadOptions {
  DcpNames names;               // the layout's adapter; null members: our own names
  bool load_optimizer = true;   // false: parameters only (--init-from)
  // With load_optimizer: a checkpoint without any optimizer.state tensor loads
  // its parameters only (optimizer_loaded false) instead of being refused.
  bool optimizer_if_present = false;
};

struct DcpLoadResult {
  IoStats io;                   // bytes read (all ranks) and the time
  DcpLayout layout = DcpLayout::kTorch;
  DcpFormat format = DcpFormat::kTorchSave;
  int64_t optimizer_step = -1;  // optimizer.state.<first param>.step, else train_state.step; -1: none
  bool optimizer_loaded = false;  // the owners' slots were loaded
  JsonValue state;              // the owners' metadata ("fsdp_cpp.state") when the checkpoint has them, else null
  std::vector<CarriedFile> carried;  // what DIR/carried/ holds, each a regular file (Note [Carried files])
};

// Loads DIR into the model's shards and, with load_optimizer, every owner's
// required slots. When the checkpoint carries fsdp_cpp.state, each owner gets
// its entry (load_state_metadata); otherwise (a checkpoint PyTorch wrote) the
// owners are not told, and the caller restores what it needs from the result
// (optimizer_step). Collective. Throws DamagedCheckpoint / UsageError (the
// same on every rank).
DcpLoadResult load_dcp(const std::string& dir, ShardedModel& model, const std::vector<StateOwner*>& owners,
                       comm::ProcessGroup& group, const DcpLoadOptions& options = {});

}  // namespace fsdp::checkpoint
