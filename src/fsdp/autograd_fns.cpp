#include "fsdp/autograd_fns.h"

#include <torch/csrc/autograd/custom_function.h>

#include "fsdp/common/error.h"
#include "fsdp/common/trace.h"
#include "fsdp/state.h"

namespace fsdp::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The unit a pre-backward node belongs to, held weakly: a graph may outlive
// its model. While the node lives it counts as part of its iteration's graph
// (Note [Graph lifetime] in state.h).
struct UnitRef : torch::CustomClassHolder {
  explicit UnitRef(const std::shared_ptr<ShardedUnit>& u) : unit(u), iteration(u->root().iteration()) {
    u->root().on_graph_node_created(iteration);
  }
  ~UnitRef() override {
    if (auto u = unit.lock()) u->root().on_graph_node_destroyed(iteration);
  }
  std::weak_ptr<ShardedUnit> unit;
  int64_t iteration;
};

struct PreBackwardFn : torch::autograd::Function<PreBackwardFn> {
  // at::TensorList, not variable_list: LibTorch gives autograd edges only to
  // Tensor and TensorList arguments (a std::vector<Tensor> is silently opaque).
  static variable_list forward(AutogradContext* ctx, at::TensorList xs, c10::intrusive_ptr<UnitRef> ref) {
    ctx->saved_data["unit"] = c10::IValue::make_capsule(std::move(ref));
    return xs.vec();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto ref = c10::static_intrusive_pointer_cast<UnitRef>(ctx->saved_data["unit"].toCapsule());
    std::shared_ptr<ShardedUnit> unit = ref->unit.lock();
    FSDP_CHECK(unit != nullptr,
               "backward through a graph whose ShardedModel was destroyed; keep the ShardedModel alive until "
               "every backward of the model has run (or drop the graph without backward)");
    unit->pre_backward(ref->iteration);
    grads.emplace_back();  // for the `ref` argument
    return grads;
  }
};

// Identity on a unit's inputs whose backward runs once every gradient with
// respect to them is computed, after the unit's own backward (Note [Frozen
// parameters] in unit.cpp: units with frozen parameters wait for it).
struct PostBackwardFn : torch::autograd::Function<PostBackwardFn> {
  static variable_list forward(AutogradContext* ctx, at::TensorList xs, c10::intrusive_ptr<UnitRef> ref) {
    ctx->saved_data["unit"] = c10::IValue::make_capsule(std::move(ref));
    return xs.vec();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto ref = c10::static_intrusive_pointer_cast<UnitRef>(ctx->saved_data["unit"].toCapsule());
    if (std::shared_ptr<ShardedUnit> unit = ref->unit.lock()) unit->on_inputs_grad_ready(ref->iteration);
    grads.emplace_back();  // for the `ref` argument
    return grads;
  }
};

// The unit's forward closure and parameters, carried through the autograd
// context as a capsule.
struct ForwardHolder : torch::CustomClassHolder {
  nn::TensorFn fn;
  std::vector<at::Tensor> params;
  std::vector<bool> input_requires_grad;
  std::function<void()> on_recompute;
  // Offloaded inputs: host copies, and the devices to bring them back to.
  bool offload = false;
  std::vector<at::Tensor> host_inputs;
  std::vector<at::Device> input_devices;
  // What the recompute skips or keeps (Note [Recompute policy] in
  // src/nn/recompute.cpp), and what forward kept for it (host copies when
  // offloaded), counted in kept_bytes while held.
  nn::RecomputePolicy policy = nn::RecomputePolicy::kFull;
  nn::KeptActivations kept;
  std::vector<at::Device> kept_devices;
  std::shared_ptr<std::atomic<int64_t>> kept_bytes;
  int64_t counted = 0;

  void release_kept() {
    kept.tensors.clear();
    kept_devices.clear();
    if (kept_bytes) kept_bytes->fetch_sub(counted);
    counted = 0;
  }
  ~ForwardHolder() override { release_kept(); }
};

// Host copies of `xs` (undefined ones stay undefined); their devices in `devices`.
std::vector<at::Tensor> to_host(const std::vector<at::Tensor>& xs, std::vector<at::Device>& devices) {
  std::vector<at::Tensor> out;
  for (const auto& x : xs) {
    devices.push_back(x.defined() ? x.device() : at::Device(at::kCPU));
    out.push_back(x.defined() ? x.detach().to(at::kCPU) : at::Tensor());
  }
  return out;
}

std::vector<at::Tensor> to_devices(const std::vector<at::Tensor>& xs, const std::vector<at::Device>& devices) {
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < xs.size(); ++i) out.push_back(xs[i].defined() ? xs[i].to(devices[i]) : at::Tensor());
  return out;
}

// Note [Checkpoint recompute]
// Forward runs fn with grad mode off (custom Function forward), saving only
// the inputs. Backward detaches the saved inputs, re-runs fn with grad mode
// on (it is off inside backward) and asks autograd::grad for the gradients of
// inputs and parameters (allow_unused: a parameter the recompute does not
// reach gets an undefined gradient; its AccumulateGrad still runs and our
// post-hook still counts it). Inputs and parameters arrive as at::TensorList:
// a plain std::vector<Tensor> argument would silently get no autograd edges.
// Both runs of fn happen inside an nn::RecomputeScope of the unit's policy:
// under kTail and kSelective the recompute skips the products the model marks
// and takes what forward kept (Note [Recompute policy] in src/nn/recompute.cpp).
struct CheckpointFn : torch::autograd::Function<CheckpointFn> {
  static variable_list forward(AutogradContext* ctx, at::TensorList inputs, at::TensorList params,
                               c10::intrusive_ptr<ForwardHolder> holder) {
    if (holder->offload) {
      // Keep only host copies; device copies are freed with the caller's refs.
      holder->host_inputs = to_host(inputs.vec(), holder->input_devices);
    } else {
      ctx->save_for_backward(inputs.vec());
    }
    ctx->saved_data["holder"] = c10::IValue::make_capsule(holder);
    (void)params;  // edges only; the holder keeps the tensors
    variable_list outputs;
    {
      nn::RecomputeScope scope(holder->policy, nn::RecomputeScope::Phase::kForward, &holder->kept);
      outputs = holder->fn(inputs.vec());
    }
    if (holder->offload) holder->kept.tensors = to_host(holder->kept.tensors, holder->kept_devices);
    holder->counted = holder->kept.bytes();
    if (holder->kept_bytes) holder->kept_bytes->fetch_add(holder->counted);
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto holder = c10::static_intrusive_pointer_cast<ForwardHolder>(ctx->saved_data["holder"].toCapsule());
    variable_list saved;
    if (holder->offload) {
      saved = to_devices(holder->host_inputs, holder->input_devices);
      holder->host_inputs.clear();
      holder->kept.tensors = to_devices(holder->kept.tensors, holder->kept_devices);
    } else {
      saved = ctx->get_saved_variables();
    }

    std::vector<at::Tensor> inputs;
    inputs.reserve(saved.size());
    for (size_t i = 0; i < saved.size(); ++i) {
      at::Tensor d = saved[i].defined() ? saved[i].detach() : at::Tensor();
      if (d.defined() && holder->input_requires_grad[i]) d.requires_grad_(true);
      inputs.push_back(d);
    }
    variable_list outputs;
    if (holder->on_recompute) holder->on_recompute();
    {
      trace::Span span("recompute", "compute");
      torch::AutoGradMode enable(true);
      nn::RecomputeScope scope(holder->policy, nn::RecomputeScope::Phase::kRecompute, &holder->kept);
      outputs = holder->fn(inputs);
      scope.check_all_replayed();
    }
    // The graph's nodes hold what they need of the kept tensors now.
    holder->release_kept();
    // Targets: the inputs that need a gradient, then the unit's parameters.
    std::vector<at::Tensor> targets;
    std::vector<int64_t> input_slot;
    for (const auto& x : inputs) {
      if (x.defined() && x.requires_grad()) {
        input_slot.push_back(static_cast<int64_t>(targets.size()));
        targets.push_back(x);
      } else {
        input_slot.push_back(-1);
      }
    }
    const size_t first_param = targets.size();
    targets.insert(targets.end(), holder->params.begin(), holder->params.end());

    std::vector<at::Tensor> outs, gouts;
    for (size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i) {
      if (outputs[i].defined() && outputs[i].requires_grad() && grad_outputs[i].defined()) {
        outs.push_back(outputs[i]);
        gouts.push_back(grad_outputs[i]);
      }
    }
    std::vector<at::Tensor> grads(targets.size());
    if (!outs.empty() && !targets.empty()) {
      grads = torch::autograd::grad(outs, targets, gouts, /*retain_graph=*/false, /*create_graph=*/false,
                                    /*allow_unused=*/true);
    }
    variable_list result;
    result.reserve(inputs.size() + holder->params.size() + 1);
    for (size_t i = 0; i < inputs.size(); ++i) {
      result.push_back(input_slot[i] >= 0 ? grads[static_cast<size_t>(input_slot[i])] : at::Tensor());
    }
    for (size_t k = 0; k < holder->params.size(); ++k) result.push_back(grads[first_param + k]);
    result.emplace_back();  // holder
    return result;
  }
};

}  // namespace

namespace {
// `xs` with the tensors that require grad passed through Fn (one node for all
// of them, holding the unit); the others unchanged. No node when none does.
template <class Fn>
std::vector<at::Tensor> through_node(ShardedUnit& unit, const std::vector<at::Tensor>& xs) {
  std::vector<at::Tensor> tracked;
  std::vector<size_t> where;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (xs[i].defined() && xs[i].requires_grad()) {
      tracked.push_back(xs[i]);
      where.push_back(i);
    }
  }
  if (tracked.empty()) return xs;
  std::vector<at::Tensor> hooked =
      Fn::apply(at::TensorList(tracked), c10::make_intrusive<UnitRef>(unit.shared_from_this()));
  std::vector<at::Tensor> out = xs;
  for (size_t k = 0; k < where.size(); ++k) out[where[k]] = hooked[k];
  return out;
}
}  // namespace

std::vector<at::Tensor> attach_pre_backward(ShardedUnit& unit, const std::vector<at::Tensor>& outputs) {
  return through_node<PreBackwardFn>(unit, outputs);
}

std::vector<at::Tensor> attach_post_backward(ShardedUnit& unit, const std::vector<at::Tensor>& inputs) {
  return through_node<PostBackwardFn>(unit, inputs);
}

std::vector<at::Tensor> checkpointed_call(const nn::TensorFn& fn, const std::vector<at::Tensor>& inputs,
                                          const std::vector<at::Tensor>& params, nn::RecomputePolicy policy,
                                          bool offload_inputs, std::function<void()> on_recompute,
                                          std::shared_ptr<std::atomic<int64_t>> kept_bytes) {
  auto holder = c10::make_intrusive<ForwardHolder>();
  holder->policy = policy;
  holder->kept_bytes = std::move(kept_bytes);
  holder->on_recompute = std::move(on_recompute);
  holder->fn = fn;
  holder->params = params;
  holder->offload = offload_inputs;
  for (const auto& x : inputs) holder->input_requires_grad.push_back(x.defined() && x.requires_grad());
  return CheckpointFn::apply(at::TensorList(inputs), at::TensorList(params), holder);
}

}  // namespace fsdp::detail
