// Unit boundaries: where a wrapper may take over a module's call.
//
// LibTorch has no module forward hooks (pytorch/pytorch#25888), so a place
// where sharding may gather and free parameters must be marked in model code.
// `Unit<Impl>` is that mark: a module holding `Impl` whose call runs the inner
// module's forward, either directly (no hooks installed: a branch and a call,
// nothing else) or through `UnitHooks::run` installed by the sharding engine.
//
// This header knows nothing about sharding; models include it, the engine
// implements UnitHooks. Parameter names are unchanged by the mark: the unit
// registers the inner module's own parameters, buffers and children as its
// own, so `layers.0.self_attn.q_proj.weight` stays exactly that.
//
// Forward signatures: any arguments; every `at::Tensor` argument is an input
// of the unit (for activation checkpointing and backward hooks), the others
// are copied and replayed unchanged on recompute. The result is an
// `at::Tensor` or a `std::vector<at::Tensor>`.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeindex>
#include <utility>
#include <vector>

namespace fsdp::nn {

// The unit's forward as a function of its tensor inputs. It may be called
// again later (activation checkpointing recomputes it in backward), so it
// owns everything it needs.
using TensorFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// Implemented by the sharding engine. Models never see it.
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  // Runs `fn(inputs)` as this unit (gather parameters, run, reshard, hook
  // backward) and returns its outputs.
  virtual std::vector<at::Tensor> run(const TensorFn& fn, const std::vector<at::Tensor>& inputs) = 0;
};

// What a model may tell planning about the order of its unit calls, so that
// plan_sharding can replay a step exactly (Note [Unsharded memory] in
// src/fsdp/plan.cpp). Implemented by a root's inner module; a model without it
// is planned as calling each unit once in registration order, with the root's
// own parameters used first.
class CallOrder {
 public:
  virtual ~CallOrder() = default;
  // The names (relative to the root) of the unit boundaries one forward calls,
  // in call order, a boundary called twice listed twice; "" stands for the
  // root's own parameters, listed where the forward first uses them (their
  // gradients are complete once backward has passed that place).
  virtual std::vector<std::string> unit_call_order() const = 0;
};

// The part of a unit that does not depend on the inner type; the engine finds
// units by walking modules and dynamic_cast-ing to UnitBase.
class UnitBase : public torch::nn::Module {
 public:
  // The wrapped module's C++ type, for wrap policies "by module type".
  std::type_index inner_type() const { return inner_type_; }
  // Its readable type name, e.g. "fsdp::models::LlamaDecoderLayerImpl".
  const std::string& inner_type_name() const { return inner_->name(); }
  torch::nn::Module& inner() { return *inner_; }
  const std::shared_ptr<torch::nn::Module>& inner_ptr() const { return inner_; }

  // Registers the members the inner module gained since the unit was built
  // (an adapter added to it: models/lora.h), under the same names.
  void adopt_new_members();

  // nullptr restores the plain call.
  void set_hooks(std::shared_ptr<UnitHooks> hooks) { hooks_ = std::move(hooks); }
  UnitHooks* hooks() const { return hooks_.get(); }

 protected:
  UnitBase(std::shared_ptr<torch::nn::Module> inner, std::type_index type);

  std::shared_ptr<torch::nn::Module> inner_;
  std::type_index inner_type_;
  std::shared_ptr<UnitHooks> hooks_;
};

namespace detail {

template <class T>
inline constexpr bool kIsTensor = std::is_same_v<std::decay_t<T>, at::Tensor>;

// Number of tensor arguments among the first I of Args.
template <size_t I, class... Args>
constexpr size_t tensor_index() {
  constexpr bool flags[] = {kIsTensor<Args>..., false};
  size_t n = 0;
  for (size_t k = 0; k < I; ++k) n += flags[k] ? 1 : 0;
  return n;
}

template <class R>
std::vector<at::Tensor> to_outputs(R&& r) {
  if constexpr (std::is_same_v<std::decay_t<R>, at::Tensor>) {
    return {std::forward<R>(r)};
  } else {
    static_assert(std::is_same_v<std::decay_t<R>, std::vector<at::Tensor>>,
                  "a Unit's forward must return at::Tensor or std::vector<at::Tensor>");
    return std::forward<R>(r);
  }
}

template <class R>
R from_outputs(std::vector<at::Tensor>&& outs) {
  if constexpr (std::is_same_v<R, at::Tensor>) {
    return std::move(outs.at(0));
  } else {
    return std::move(outs);
  }
}

}  // namespace detail

template <class Impl>
class UnitImpl : public UnitBase {
 public:
  explicit UnitImpl(std::shared_ptr<Impl> inner)
      : UnitBase(inner, std::type_index(typeid(Impl))), impl_(std::move(inner)) {}

  Impl& impl() { return *impl_; }
  const std::shared_ptr<Impl>& impl_ptr() const { return impl_; }

  template <class... Args>
  auto forward(Args&&... args) -> decltype(std::declval<Impl&>().forward(std::forward<Args>(args)...)) {
    using R = decltype(std::declval<Impl&>().forward(std::forward<Args>(args)...));
    if (!hooks_) return impl_->forward(std::forward<Args>(args)...);

    std::vector<at::Tensor> inputs;
    (collect(inputs, args), ...);
    // Copies of the non-tensor arguments; tensor slots are left empty so the
    // closure does not keep the inputs alive (they come back through `ins`).
    auto saved = std::make_shared<std::tuple<std::decay_t<Args>...>>(strip(args)...);
    std::shared_ptr<Impl> impl = impl_;
    TensorFn fn = [impl, saved](const std::vector<at::Tensor>& ins) {
      return detail::to_outputs(call_with(*impl, *saved, ins, std::index_sequence_for<Args...>{}));
    };
    return detail::from_outputs<R>(hooks_->run(fn, inputs));
  }

  // Another method of the inner module, run as this unit as forward is (FSDP2's
  // register_fsdp_forward_method: an `encode` or `generate` step):
  // `unit->call(&BlockImpl::encode, x)`. The same rules as forward: tensor
  // arguments are the unit's inputs, the others are copied; the result is an
  // at::Tensor or a std::vector<at::Tensor>. Without hooks, a plain call.
  template <class Method, class... Args>
  auto call(Method method, Args&&... args)
      -> decltype((std::declval<Impl&>().*method)(std::forward<Args>(args)...)) {
    using R = decltype((std::declval<Impl&>().*method)(std::forward<Args>(args)...));
    if (!hooks_) return (impl_.get()->*method)(std::forward<Args>(args)...);

    std::vector<at::Tensor> inputs;
    (collect(inputs, args), ...);
    auto saved = std::make_shared<std::tuple<std::decay_t<Args>...>>(strip(args)...);
    std::shared_ptr<Impl> impl = impl_;
    TensorFn fn = [impl, saved, method](const std::vector<at::Tensor>& ins) {
      return detail::to_outputs(call_method(*impl, method, *saved, ins, std::index_sequence_for<Args...>{}));
    };
    return detail::from_outputs<R>(hooks_->run(fn, inputs));
  }

 private:
  template <class T>
  static void collect(std::vector<at::Tensor>& out, const T& a) {
    if constexpr (detail::kIsTensor<T>) out.push_back(a);
  }
  template <class T>
  static std::decay_t<T> strip(const T& a) {
    if constexpr (detail::kIsTensor<T>) return at::Tensor();
    else return a;
  }
  template <class Tuple, size_t... I>
  static decltype(auto) call_with(Impl& impl, Tuple& saved, const std::vector<at::Tensor>& ins,
                                  std::index_sequence<I...>) {
    using Types = std::decay_t<Tuple>;
    return impl.forward(pick<I, Types>(saved, ins)...);
  }
  template <class Method, class Tuple, size_t... I>
  static decltype(auto) call_method(Impl& impl, Method method, Tuple& saved, const std::vector<at::Tensor>& ins,
                                    std::index_sequence<I...>) {
    using Types = std::decay_t<Tuple>;
    return (impl.*method)(pick<I, Types>(saved, ins)...);
  }
  template <size_t I, class Types>
  static decltype(auto) pick(Types& saved, const std::vector<at::Tensor>& ins) {
    using T = std::tuple_element_t<I, Types>;
    if constexpr (detail::kIsTensor<T>) {
      return at::Tensor(ins.at(tensor_slot<I>(static_cast<Types*>(nullptr))));
    } else {
      return static_cast<const T&>(std::get<I>(saved));
    }
  }
  template <size_t I, class... Ts>
  static constexpr size_t tensor_slot(std::tuple<Ts...>*) {
    return detail::tensor_index<I, Ts...>();
  }

  std::shared_ptr<Impl> impl_;
};

// Holder in LibTorch's style: `Unit<BlockImpl> u(std::make_shared<BlockImpl>(...))`,
// `u(x)` runs the forward, `u->impl()` reaches the inner module.
template <class Impl>
class Unit : public torch::nn::ModuleHolder<UnitImpl<Impl>> {
 public:
  using torch::nn::ModuleHolder<UnitImpl<Impl>>::ModuleHolder;
  explicit Unit(std::shared_ptr<Impl> inner)
      : torch::nn::ModuleHolder<UnitImpl<Impl>>(std::make_shared<UnitImpl<Impl>>(std::move(inner))) {}

  // ModuleHolder's own call operator cannot see through a template forward.
  template <class... Args>
  decltype(auto) operator()(Args&&... args) {
    return this->get()->forward(std::forward<Args>(args)...);
  }
};

template <class Impl, class... CtorArgs>
Unit<Impl> make_unit(CtorArgs&&... args) {
  return Unit<Impl>(std::make_shared<Impl>(std::forward<CtorArgs>(args)...));
}

// All units under `root` (root included when it is one), in pre-order, with
// their qualified names ("" for root).
std::vector<std::pair<std::string, std::shared_ptr<UnitBase>>> find_units(
    const std::shared_ptr<torch::nn::Module>& root);

}  // namespace fsdp::nn
