// One rank of the fsdp-cpp side of the API peer test (tests/peers/api_parity.py):
// a small model trained case by case, each case one of FSDP2's options or
// methods as fsdp-cpp spells it; tests/peers/fsdp2_api_peer.py runs the same
// cases with PyTorch FSDP2 itself. Per step each rank writes the mean loss over
// the ranks and every parameter's full gradient as JSON lines.
//
//   api_peer --cases cases.json --init init.bin --data data.bin --out ours
//
// Started W times with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT. The model
// (PeerNet below and in fsdp2_api_peer.py): h = x W_in^T; h = shift(h) (h + s);
// three blocks h + tanh(h W1^T + b1) W2^T (block 2 through its `encode` method
// when the case says so: 0.5 x its forward); loss = mean((h W_out^T - y)^2).
// Units: the root (W_in, W_out), `shift`, `blocks.0` .. `blocks.2`. Optimizer:
// SGD (p -= lr g) on the shards, and on ignored parameters locally.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include "fsdp/comm/rendezvous.h"
#include "fsdp/common/error.h"
#include "fsdp/common/main.h"
#include "fsdp/fsdp.h"
#include "fsdp/nn/unit.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/state_dict.h"

namespace {

using fsdp::nn::Unit;

constexpr int64_t kDin = 6, kD = 8, kF = 12, kDout = 5, kBlocks = 3;

struct ShiftImpl : torch::nn::Module {
  at::Tensor s;  // (D)
  ShiftImpl() { s = register_parameter("s", torch::zeros({kD})); }
  at::Tensor forward(const at::Tensor& h) { return h + s; }
};

struct BlockImpl : torch::nn::Module {
  at::Tensor w1, b1, w2;  // (F, D), (F), (D, F)
  BlockImpl() {
    w1 = register_parameter("w1", torch::zeros({kF, kD}));
    b1 = register_parameter("b1", torch::zeros({kF}));
    w2 = register_parameter("w2", torch::zeros({kD, kF}));
  }
  at::Tensor forward(const at::Tensor& x) { return x + torch::tanh(x.matmul(w1.t()) + b1).matmul(w2.t()); }
  at::Tensor encode(const at::Tensor& x) { return forward(x) * 0.5; }  // another entry point
};

struct NetImpl : torch::nn::Module {
  at::Tensor w_in;  // (D, Din)
  Unit<ShiftImpl> shift{nullptr};
  torch::nn::ModuleList blocks_list{nullptr};
  std::vector<Unit<BlockImpl>> blocks;
  at::Tensor w_out;  // (Dout, D)
  bool encode = false;
  NetImpl() {
    w_in = register_parameter("w_in", torch::zeros({kD, kDin}));
    shift = register_module("shift", fsdp::nn::make_unit<ShiftImpl>().ptr());
    blocks_list = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < kBlocks; ++i) {
      blocks.push_back(fsdp::nn::make_unit<BlockImpl>());
      blocks_list->push_back(blocks.back().ptr());
    }
    w_out = register_parameter("w_out", torch::zeros({kDout, kD}));
  }
  at::Tensor forward(const at::Tensor& x, const at::Tensor& y) {
    at::Tensor h = shift(x.matmul(w_in.t()));
    for (int64_t i = 0; i < kBlocks; ++i) {
      h = encode && i == kBlocks - 1 ? blocks[size_t(i)]->call(&BlockImpl::encode, h) : blocks[size_t(i)](h);
    }
    return (h.matmul(w_out.t()) - y).pow(2).mean();
  }
};

at::ScalarType dtype_of(const std::string& s) {
  if (s == "bf16") return at::kBFloat16;
  if (s == "fp16") return at::kHalf;
  FSDP_CHECK(s == "fp32", "unknown dtype '", s, "' in the cases file");
  return at::kFloat;
}

fsdp::ReshardAfterForward reshard_of(const nlohmann::json& j) {
  if (j.is_boolean()) return fsdp::ReshardAfterForward(j.get<bool>());
  return fsdp::ReshardAfterForward::to_group(j.get<int>());
}

// The custom collectives of the cases: a reduce-scatter that halves its
// result (observable on both sides) and an all-gather that counts its calls.
struct HalvingReduceScatter : fsdp::ReduceScatterComm {
  fsdp::comm::WorkPtr operator()(const at::Tensor& out, const at::Tensor& in, fsdp::comm::ProcessGroup& group,
                                 fsdp::comm::ReduceOp op) override {
    group.reduce_scatter(out, in, op)->wait();
    at::NoGradGuard no_grad;
    out.mul_(0.5);
    return nullptr;
  }
};
struct CountingAllGather : fsdp::AllGatherComm {
  int64_t calls = 0, allocations = 0;
  at::Tensor allocate(int64_t numel, at::ScalarType dtype, at::Device device) override {
    ++allocations;
    return fsdp::AllGatherComm::allocate(numel, dtype, device);
  }
  fsdp::comm::WorkPtr operator()(const at::Tensor& out, const at::Tensor& in, fsdp::comm::ProcessGroup& group) override {
    ++calls;
    return group.all_gather(out, in);
  }
};

std::vector<float> read_floats(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  FSDP_CHECK(f.good(), path, ": cannot open it (api_parity.py writes it)");
  f.seekg(0, std::ios::end);
  const auto n = static_cast<size_t>(f.tellg()) / sizeof(float);
  f.seekg(0);
  std::vector<float> v(n);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(float)));
  return v;
}

// The parameters in the init file's order (api_parity.py: the model's named_parameters order).
void load_init(NetImpl& net, const std::vector<float>& init) {
  size_t off = 0;
  at::NoGradGuard no_grad;
  for (auto& p : net.named_parameters(true)) {
    const auto n = static_cast<size_t>(p.value().numel());
    FSDP_CHECK(off + n <= init.size(), "the init file is short at parameter '", p.key(), "'");
    p.value().copy_(torch::from_blob(const_cast<float*>(init.data() + off), p.value().sizes(), at::kFloat));
    off += n;
  }
  FSDP_CHECK(off == init.size(), "the init file has ", init.size(), " floats, the model ", off);
}

int run(int argc, char** argv) {
  std::string cases_path, init_path, data_path, out_prefix;
  CLI::App app{"fsdp-cpp's side of the FSDP2 API peer test"};
  app.add_option("--cases", cases_path)->required();
  app.add_option("--init", init_path)->required();
  app.add_option("--data", data_path)->required();
  app.add_option("--out", out_prefix)->required();
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(1);

  const fsdp::comm::Runtime rt = fsdp::comm::init_process_group(fsdp::comm::detect_world());
  const fsdp::comm::ProcessGroupPtr& world = rt.world_group;
  const int W = world->size(), rank = world->rank();
  std::ifstream cf(cases_path);
  const nlohmann::json spec = nlohmann::json::parse(cf);
  const int steps = spec.at("steps"), B = spec.at("batch"), A_max = spec.at("max_micro");
  const size_t data_ranks = spec.at("data_ranks");
  const double lr = spec.at("lr");
  const std::vector<float> init = read_floats(init_path);
  const std::vector<float> data = read_floats(data_path);  // (steps, A_max, data_ranks, B, Din + Dout)
  std::ofstream out(out_prefix + ".rank" + std::to_string(rank) + ".jsonl");

  for (const nlohmann::json& c : spec.at("cases")) {
    if (c.contains("worlds")) {
      const auto ws = c.at("worlds").get<std::vector<int>>();
      if (std::find(ws.begin(), ws.end(), W) == ws.end()) continue;
    }
    auto impl = std::make_shared<NetImpl>();
    load_init(*impl, init);
    if (c.value("sync_module_states", false)) {
      // Every rank starts elsewhere; rank 0's values are broadcast when sharding.
      at::NoGradGuard no_grad;
      for (auto& p : impl->named_parameters(true)) p.value().mul_(1.0 + rank);
    }
    impl->encode = c.value("encode", false);
    for (const std::string& name : c.value("frozen", std::vector<std::string>{})) {
      impl->named_parameters(true)[name].set_requires_grad(false);
    }
    Unit<NetImpl> root(impl);

    fsdp::FsdpOptions o;
    o.forward_prefetch = c.value("forward_prefetch", false);
    o.sync_module_states = c.value("sync_module_states", false);
    o.limit_all_gathers = c.value("limit_all_gathers", 2);
    o.backward_prefetch = fsdp::parse_backward_prefetch(c.value("backward_prefetch", "pre"));
    if (c.value("sharding", "full") == "none") o.strategy = fsdp::ShardingStrategy::kNoShard;
    if (c.contains("wrap_size")) o.wrap = fsdp::WrapPolicy::size_based(c.at("wrap_size").get<int64_t>());
    if (c.value("sharding", "full") == "hybrid") {
      o.strategy = fsdp::ShardingStrategy::kHybridShard;
      o.hybrid_shard_size = c.at("hybrid_shard_size");
    }
    if (c.contains("reshard")) o.reshard_after_forward = reshard_of(c.at("reshard"));
    for (const std::string& name : c.value("ignored", std::vector<std::string>{})) {
      o.ignored_params.push_back(impl->named_parameters(true)[name]);
    }
    const nlohmann::json unit_cases = c.value("units", nlohmann::json::object());
    for (auto it = unit_cases.begin(); it != unit_cases.end(); ++it) {
      fsdp::UnitOverride ov;
      ov.names = {it.key() == "<root>" ? std::string() : it.key()};
      const nlohmann::json& u = it.value();
      if (u.contains("reshard")) ov.options.reshard_after_forward = reshard_of(u.at("reshard"));
      if (u.contains("mp")) {
        fsdp::MixedPrecision mp;
        mp.param_dtype = dtype_of(u["mp"].value("param", "fp32"));
        mp.reduce_dtype = dtype_of(u["mp"].value("reduce", "fp32"));
        if (u["mp"].contains("output")) mp.output_dtype = dtype_of(u["mp"]["output"]);
        mp.cast_forward_inputs = u["mp"].value("cast_forward_inputs", true);
        ov.options.mixed_precision = mp;
      }
      if (u.contains("offload")) ov.options.cpu_offload = u.at("offload").get<bool>();
      if (u.contains("forward_prefetch")) ov.options.forward_prefetch = u["forward_prefetch"].get<std::vector<std::string>>();
      if (u.contains("backward_prefetch")) {
        ov.options.backward_prefetch = u["backward_prefetch"].get<std::vector<std::string>>();
      }
      o.unit_overrides.push_back(ov);
    }
    auto sharded = fsdp::fully_shard(root.ptr(), world, o);
    auto counting = std::make_shared<CountingAllGather>();
    if (c.contains("set_reshard_after_forward")) sharded->set_reshard_after_forward(c.at("set_reshard_after_forward"));
    if (c.contains("divide_factor")) sharded->set_gradient_divide_factor(c.at("divide_factor"));
    if (c.value("force_sum", false)) sharded->set_force_sum_reduction_for_comms(true);
    if (c.value("custom_comms", false)) {
      sharded->set_custom_reduce_scatter(std::make_shared<HalvingReduceScatter>());
      sharded->set_custom_all_gather(counting);
    }
    if (c.value("hook", false)) {
      sharded->set_all_reduce_hook([](at::Tensor& t) {
        at::NoGradGuard no_grad;
        t.mul_(2.0);
      });
    }
    for (const std::string& u : c.value("no_unshard_in_backward", std::vector<std::string>{})) {
      sharded->set_unshard_in_backward(false, u);
    }
    std::vector<at::Tensor> ignored = o.ignored_params;
    const bool adamw = c.value("optimizer", "sgd") == "adamw";
    fsdp::optim::AdamWOptions ao;
    ao.lr = lr;
    ao.weight_decay = 0;
    fsdp::optim::AdamW opt(ao);
    if (adamw) opt.add_shards(sharded->shards());
    const auto optimizer_state = [&] {
      std::vector<fsdp::ShardOptimizerState> out;
      for (auto& slot : opt.slots()) out.push_back({slot.param, {{"exp_avg", slot.exp_avg}, {"exp_avg_sq", slot.exp_avg_sq}}});
      return out;
    };
    const auto values = [](const at::Tensor& t) {
      const at::Tensor v = t.detach().to(at::kFloat).contiguous().reshape({-1});
      return std::vector<float>(v.data_ptr<float>(), v.data_ptr<float>() + v.numel());
    };
    const bool state_dicts = c.value("state_dicts", false);
    const nlohmann::json micro = c.value("micro", nlohmann::json::array({nlohmann::json::object()}));
    const int A = static_cast<int>(micro.size());
    FSDP_CHECK(A <= A_max, "case ", c.at("name").get<std::string>(), " has more micro-batches than the data");
    const bool extra = state_dicts || c.value("summon_writeback", false);
    for (int step = 0; step < steps + (extra ? 1 : 0); ++step) {
      nlohmann::json loaded = nlohmann::json::object();
      if (state_dicts && step == steps) {
        // The state dicts of the trained model (PyTorch's StateDictOptions), then
        // a scaled model state and the optimizer state loaded from rank 0.
        fsdp::StateDictOptions full;
        full.full_state_dict = true;
        full.cpu_offload = true;
        const fsdp::StateDict sd = fsdp::get_model_state_dict(*sharded, full);  // rank 0's alone
        const fsdp::StateDict parts = fsdp::get_model_state_dict(*sharded);
        const fsdp::OptimizerStateDict osd =
            fsdp::get_optimizer_state_dict(*sharded, optimizer_state(), opt.step_count(), full);
        fsdp::StateDictOptions trainable_only;
        trainable_only.ignore_frozen_params = true;
        nlohmann::json keys = nlohmann::json::array();
        for (const auto& [name, t] : fsdp::get_model_state_dict(*sharded, trainable_only)) keys.push_back(name);
        loaded["trainable_keys"] = keys;
        for (const auto& [name, t] : sd) loaded["sd_full"][name] = values(t.value);
        for (const auto& [name, t] : parts) loaded["sd_parts"][name] = {t.offset, values(t.value)};
        for (const auto& [name, m] : osd.state) {
          for (const auto& [k, t] : m) loaded["osd_full"][name][k] = values(t.value);
        }
        // Non-strict, sharded: w_in left out is reported missing (and keeps its values).
        fsdp::StateDict without = parts;
        without.erase(std::remove_if(without.begin(), without.end(), [](const auto& e) { return e.first == "w_in"; }),
                      without.end());
        fsdp::StateDictOptions lenient;
        lenient.strict = false;
        const fsdp::IncompatibleKeys ik = fsdp::set_model_state_dict(*sharded, without, lenient);
        loaded["missing"] = ik.missing;
        fsdp::StateDict scaled = sd;
        for (auto& [name, t] : scaled) t.value = t.value * 0.5;
        fsdp::StateDictOptions from0;
        from0.full_state_dict = true;
        from0.broadcast_from_rank0 = true;
        fsdp::set_model_state_dict(*sharded, rank == 0 ? scaled : fsdp::StateDict{}, from0);
        opt.set_step_count(fsdp::set_optimizer_state_dict(*sharded, optimizer_state(),
                                                          rank == 0 ? osd : fsdp::OptimizerStateDict{}, from0));
      }
      sharded->zero_grad();
      for (auto& p : ignored) p.mutable_grad().reset();
      double local = 0;
      for (int m = 0; m < A; ++m) {
        const nlohmann::json& mb = micro[size_t(m)];
        // FSDP2's per-micro-batch settings, in the order fsdp2_api_peer.py applies them.
        sharded->set_requires_gradient_sync(mb.value("sync", true));
        for (const std::string& u : mb.value("no_sync_units", std::vector<std::string>{})) {
          sharded->set_requires_gradient_sync(false, u, /*recurse=*/false);
        }
        sharded->set_requires_all_reduce(mb.value("all_reduce", true));
        sharded->set_reshard_after_backward(mb.value("reshard_after_backward", true));
        sharded->set_is_last_backward(mb.value("is_last_backward", true));
        fsdp::UnshardHandle handle;
        if (c.value("unshard_first", false)) handle = sharded->unshard("blocks.0", /*async_op=*/true);
        const size_t row =
            ((static_cast<size_t>(std::min(step, steps - 1)) * A_max + m) * data_ranks + static_cast<size_t>(rank)) * B;
        const at::Tensor batch =
            torch::from_blob(const_cast<float*>(data.data() + row * (kDin + kDout)), {B, kDin + kDout}, at::kFloat)
                .clone();
        const at::Tensor x = batch.narrow(1, 0, kDin), y = batch.narrow(1, kDin, kDout);
        at::Tensor loss = root(x, y) / A;
        loss.backward();
        local += loss.item<double>();
      }
      at::Tensor total = at::tensor({local}, at::kDouble);
      world->all_reduce(total, fsdp::comm::ReduceOp::kSum)->wait();
      // Every parameter's full gradient: each entry's shard gathered over its shard group.
      nlohmann::json grads = nlohmann::json::object();
      sharded->grad_norm();  // finishes reductions a backward left in flight
      const auto shards = sharded->shards();
      const auto& units = sharded->units();
      for (size_t e = 0; e < units.size(); ++e) {
        if (!units[e].trainable || units[e].padded_numel == 0) continue;
        at::Tensor full = at::empty({units[e].padded_numel}, at::kFloat);
        const at::Tensor g = shards[e].grad.to(at::kFloat).contiguous();
        if (units[e].shard_numel == units[e].padded_numel) {
          full.copy_(g);
        } else {
          sharded->shard_group()->all_gather(full, g)->wait();
        }
        for (const auto& p : units[e].params) {
          const at::Tensor v = full.narrow(0, p.flat_offset, p.numel);
          grads[p.name] = std::vector<float>(v.data_ptr<float>(), v.data_ptr<float>() + v.numel());
        }
      }
      for (auto& p : impl->named_parameters(true)) {
        for (const at::Tensor& t : ignored) {
          if (!t.is_same(p.value())) continue;
          const at::Tensor g = p.value().grad().defined() ? p.value().grad().contiguous() : at::zeros_like(p.value());
          grads[p.key()] = std::vector<float>(g.data_ptr<float>(), g.data_ptr<float>() + g.numel());
        }
      }
      nlohmann::json line = {{"case", c.at("name")}, {"step", step}, {"loss", total.item<double>() / W}, {"grads", grads}};
      for (auto it = loaded.begin(); it != loaded.end(); ++it) line[it.key()] = it.value();
      if (c.value("custom_comms", false)) line["all_gathers"] = counting->calls;
      // SGD on the shards (trainable entries) and on the ignored parameters.
      if (adamw) {
        opt.step();
      } else {
        at::NoGradGuard no_grad;
        for (const auto& s : shards) {
          if (s.trainable) s.param.add_(s.grad.to(s.param.scalar_type()), -lr);
        }
      }
      {
        at::NoGradGuard no_grad;
        for (auto& t : ignored) {
          if (t.grad().defined()) t.add_(t.grad(), -lr);
        }
      }
      if (c.value("summon", false) && step == steps - 1) {
        // FSDP1's summon_full_params: the trained parameters read through the module.
        const fsdp::FullParams full = sharded->summon_full_params();
        nlohmann::json values = nlohmann::json::object();
        for (auto& p : impl->named_parameters(true)) {
          const at::Tensor v = p.value().detach().to(at::kFloat).contiguous();
          values[p.key()] = std::vector<float>(v.data_ptr<float>(), v.data_ptr<float>() + v.numel());
        }
        line["params"] = values;
      }
      if (c.value("summon_writeback", false) && step == steps - 1) {
        // FSDP1's summon_full_params(writeback=True): halve every parameter in place.
        const fsdp::FullParams full = sharded->summon_full_params(/*writeback=*/true);
        at::NoGradGuard no_grad;
        for (auto& p : impl->named_parameters(true)) p.value().mul_(0.5);
      }
      out << line.dump() << "\n";
    }
  }
  out.close();
  world->barrier(std::chrono::minutes(2));
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return fsdp::run_main("api_peer", [&] { return run(argc, argv); }); }
