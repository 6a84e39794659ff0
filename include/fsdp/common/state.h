// The state seam: what a checkpoint persists of a component.
//
// Note [State seam]. Whatever owns state that a resumed run needs (the
// optimizer's moments and step count, the model family's configuration, the
// trainer's counters and data position) is a StateOwner: named state slots,
// each a tensor element-wise aligned with one of the model's local shards
// (so every checkpoint format shards, reshards and names it exactly as the
// shard it shadows), and small opaque metadata (JSON). Checkpoint formats
// (checkpoint/sharded.h, checkpoint/dcp.h) persist owners through this
// interface only: they never name an optimizer class or a model family. A
// second optimizer or model family is one class and one registration.
//
// Contract of one checkpoint's owners: their keys differ, and so do the
// kinds of their slots (a section of the checkpoint is named by its kind).
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json_fwd.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/common/error.h"

namespace fsdp {

// What load_state_metadata throws when the saved metadata is not of the shape
// this owner writes (a damaged or hand-made checkpoint; another owner's state,
// such as another optimizer's, is a UsageError instead). The checkpoint
// formats report it as damage of the checkpoint, naming the owner's key, so a
// resume falls back to an older checkpoint (issue 50).
class MalformedState : public Failure {
 public:
  using Failure::Failure;
};

// One named per-shard state tensor of a StateOwner.
struct StateSlot {
  std::string kind;     // its section's name: "exp_avg", "momentum_buffer" (unique in a checkpoint)
  at::Tensor shadows;   // the model's local shard (ShardRef::param) this state is aligned with
  at::Tensor value;     // 1-D, shadows.numel() elements, any float dtype; saved as is, overwritten in place on load
  bool required = true; // loading fails when the checkpoint lacks it; false: zeroed (a Kahan compensation buffer)
};

// A component with checkpointed state. Saving reads state_slots() and
// state_metadata(); loading overwrites the slots' values in place, then calls
// load_state_metadata() with what was saved.
class StateOwner {
 public:
  virtual ~StateOwner() = default;
  // Its key in a checkpoint: "optimizer", "model", "trainer".
  virtual std::string state_key() const = 0;
  // Its per-shard tensors, in a fixed order (empty for metadata-only owners).
  virtual std::vector<StateSlot> state_slots() = 0;
  // Small, JSON; checkpoints store it without reading it.
  virtual nlohmann::json state_metadata() const = 0;
  // What state_metadata() returned when the checkpoint was saved (null when the
  // checkpoint has none for this key). Throws UsageError when it does not fit
  // this owner (another optimizer type, another model), saying which and why;
  // MalformedState when it is not what this owner writes (a checkpoint is
  // untrusted input: every field is checked before it is used).
  virtual void load_state_metadata(const nlohmann::json& saved) = 0;
};

// An optimizer's saved metadata {"type": ..., "step": t, ...}: checks it is
// one of `type` (UsageError naming both types, or saying the checkpoint has no
// optimizer state when `saved` is null) and returns its step count.
int64_t saved_optimizer_step(const nlohmann::json& saved, const std::string& type);

// A metadata-only owner around a value (the trainer's counters, a model
// family's configuration): saves `metadata`; load_state_metadata runs `check`
// (when given) on what was saved, which throws MalformedState for what the
// saver never writes, then stores it in `loaded`.
class MetadataState : public StateOwner {
 public:
  using Check = std::function<void(const nlohmann::json& saved)>;
  MetadataState(std::string key, const nlohmann::json& metadata, Check check = nullptr);
  MetadataState(MetadataState&& other) noexcept;             // leaves `other` without values
  MetadataState& operator=(MetadataState&& other) noexcept;  // the same
  ~MetadataState() override;
  std::string state_key() const override { return key_; }
  std::vector<StateSlot> state_slots() override { return {}; }
  nlohmann::json state_metadata() const override;
  void load_state_metadata(const nlohmann::json& saved) override;
  // What the last load found (null before a load or when the checkpoint had none).
  const nlohmann::json& loaded() const;

 private:
  std::string key_;
  struct Values;
  std::unique_ptr<Values> values_;
};

}  // namespace fsdp
