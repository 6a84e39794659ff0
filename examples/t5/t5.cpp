// A T5-style encoder-decoder (Raffel et al. 2020, arXiv:1910.10683) trained with fsdp-cpp to
// reverse strings: "fsdp" -> "pdsf". Relative position bias, RMS layer norm without bias, ReLU
// feed-forward, no attention scaling, one embedding shared by the encoder, the decoder and the
// output layer, as in Hugging Face's T5. Every encoder and decoder block is its own FSDP unit, as
// the PyTorch FSDP tutorials wrap T5Block.
//
//   t5 --steps 300 --show 4                         train, then reverse 4 new strings greedily
//   t5 --steps 20 --nproc-per-node 2                two processes, started by the library's launcher
//   torchrun --no-python --standalone --nproc-per-node 2 ./t5 --steps 20
//
// The relative position bias of each stack lives in the root, which computes it once per forward
// and hands it to every block: Hugging Face's T5 computes it in the stack's first block and passes
// it on, which would make the first unit's output feed the others' bias.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <typeindex>

#include "fsdp/all.h"

namespace {

// Tokens: 0 pad (also the decoder's start token, as in T5), 1 end of sequence, 2.. the letters.
constexpr int64_t kPad = 0, kEos = 1, kFirstLetter = 2;

struct T5Config {
  int64_t vocab = kFirstLetter + 26;  // V
  int64_t d_model = 64;               // D
  int64_t heads = 4;                  // H
  int64_t d_kv = 16;                  // Dh
  int64_t d_ff = 128;
  int64_t layers = 2;                 // encoder blocks, and decoder blocks
  int64_t buckets = 32;               // relative position buckets
  int64_t max_distance = 64;
  int64_t min_len = 3, max_len = 10;  // letters per string
  int64_t seq() const { return max_len + 1; }  // T: letters and end of sequence, padded
};

// T5's layer norm: scale only, no mean subtraction, no bias; the variance in fp32.
struct RmsNormImpl : torch::nn::Module {
  explicit RmsNormImpl(int64_t dim) : weight(register_parameter("weight", torch::ones({dim}))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    auto var = x.to(torch::kFloat).pow(2).mean(-1, /*keepdim=*/true);
    return weight * (x * torch::rsqrt(var + 1e-6)).to(weight.scalar_type());
  }
  torch::Tensor weight;  // (D)
};
TORCH_MODULE(RmsNorm);

torch::nn::Linear linear(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

// Multi-head attention without scaling (T5 folds it into the initialization); `bias` is added to
// the scores: relative position bias and masks, (1 or B, H or 1, Tq, Tk).
struct AttentionImpl : torch::nn::Module {
  explicit AttentionImpl(const T5Config& c)
      : heads(c.heads), d_kv(c.d_kv), q(register_module("q", linear(c.d_model, c.heads * c.d_kv))),
        k(register_module("k", linear(c.d_model, c.heads * c.d_kv))),
        v(register_module("v", linear(c.d_model, c.heads * c.d_kv))),
        o(register_module("o", linear(c.heads * c.d_kv, c.d_model))) {}

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& memory, const torch::Tensor& bias) {
    const int64_t B = x.size(0), Tq = x.size(1), Tk = memory.size(1);
    auto split = [&](const torch::Tensor& t, int64_t T) { return t.view({B, T, heads, d_kv}).transpose(1, 2); };
    auto scores = split(q(x), Tq).matmul(split(k(memory), Tk).transpose(-2, -1)) + bias;  // (B, H, Tq, Tk)
    auto weights = torch::softmax(scores.to(torch::kFloat), -1).to(x.scalar_type());
    return o(weights.matmul(split(v(memory), Tk)).transpose(1, 2).reshape({B, Tq, heads * d_kv}));
  }

  int64_t heads, d_kv;
  torch::nn::Linear q, k, v, o;
};
TORCH_MODULE(Attention);

struct FeedForwardImpl : torch::nn::Module {
  explicit FeedForwardImpl(const T5Config& c)
      : wi(register_module("wi", linear(c.d_model, c.d_ff))), wo(register_module("wo", linear(c.d_ff, c.d_model))) {}
  torch::Tensor forward(const torch::Tensor& x) { return wo(torch::relu(wi(x))); }
  torch::nn::Linear wi, wo;
};
TORCH_MODULE(FeedForward);

// Encoder block: self-attention and feed-forward, each pre-normed with a residual.
struct EncoderBlockImpl : torch::nn::Module {
  explicit EncoderBlockImpl(const T5Config& c)
      : norm1(register_module("norm1", RmsNorm(c.d_model))), attn(register_module("attn", Attention(c))),
        norm2(register_module("norm2", RmsNorm(c.d_model))), ff(register_module("ff", FeedForward(c))) {}

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& bias) {
    auto h = norm1(x);
    auto y = x + attn(h, h, bias);
    return y + ff(norm2(y));
  }

  RmsNorm norm1;
  Attention attn;
  RmsNorm norm2;
  FeedForward ff;
};

// Decoder block: causal self-attention, cross-attention to the encoder's output, feed-forward.
struct DecoderBlockImpl : torch::nn::Module {
  explicit DecoderBlockImpl(const T5Config& c)
      : norm1(register_module("norm1", RmsNorm(c.d_model))), self_attn(register_module("self_attn", Attention(c))),
        norm2(register_module("norm2", RmsNorm(c.d_model))), cross_attn(register_module("cross_attn", Attention(c))),
        norm3(register_module("norm3", RmsNorm(c.d_model))), ff(register_module("ff", FeedForward(c))) {}

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& self_bias, const torch::Tensor& memory,
                        const torch::Tensor& cross_bias) {
    auto h = norm1(x);
    auto y = x + self_attn(h, h, self_bias);
    y = y + cross_attn(norm2(y), memory, cross_bias);
    return y + ff(norm3(y));
  }

  RmsNorm norm1;
  Attention self_attn;
  RmsNorm norm2;
  Attention cross_attn;
  RmsNorm norm3;
  FeedForward ff;
};

// Hugging Face's T5Attention._relative_position_bucket: exact buckets for short distances,
// logarithmic ones up to max_distance; bidirectional (encoder) buckets split by direction.
torch::Tensor relative_buckets(int64_t tq, int64_t tk, bool bidirectional, const T5Config& c) {
  auto rel = torch::arange(tk, torch::kLong).view({1, tk}) - torch::arange(tq, torch::kLong).view({tq, 1});
  int64_t n = c.buckets;
  auto buckets = torch::zeros_like(rel);
  if (bidirectional) {
    n /= 2;
    buckets += (rel > 0).to(torch::kLong) * n;
    rel = rel.abs();
  } else {
    rel = -torch::clamp_max(rel, 0);
  }
  const int64_t exact = n / 2;
  auto large = exact + (torch::log(rel.to(torch::kFloat) / exact) / std::log(static_cast<double>(c.max_distance) / exact) *
                        static_cast<double>(n - exact))
                           .to(torch::kLong);
  large = torch::clamp_max(large, n - 1);
  return buckets + torch::where(rel < exact, rel, large);
}

struct T5Impl : torch::nn::Module {
  explicit T5Impl(const T5Config& c)
      : cfg(c), shared(register_module("shared", torch::nn::Embedding(c.vocab, c.d_model))),
        encoder_bias(register_module("encoder_bias", torch::nn::Embedding(c.buckets, c.heads))),
        decoder_bias(register_module("decoder_bias", torch::nn::Embedding(c.buckets, c.heads))),
        encoder_norm(register_module("encoder_norm", RmsNorm(c.d_model))),
        decoder_norm(register_module("decoder_norm", RmsNorm(c.d_model))) {
    auto enc = register_module("encoder", torch::nn::ModuleList());
    auto dec = register_module("decoder", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.layers; ++i) {
      encoder.push_back(fsdp::nn::make_unit<EncoderBlockImpl>(c));
      enc->push_back(encoder.back().ptr());
      decoder.push_back(fsdp::nn::make_unit<DecoderBlockImpl>(c));
      dec->push_back(decoder.back().ptr());
    }
  }

  // src (B, T) and tgt (B, T) token ids -> {loss, logits (B, T, V)}. The loss is each string's
  // mean token loss (padding left out), averaged over the strings: every string weighs the same,
  // so the processes' mean is the global batch's whatever the lengths on each.
  std::vector<torch::Tensor> forward(const torch::Tensor& src, const torch::Tensor& tgt) {
    const int64_t T = src.size(1);
    const auto dtype = shared->weight.scalar_type();
    const auto neg = -1e9;
    // Encoder: bidirectional position bias, padding keys masked.
    auto enc_bias = encoder_bias(relative_buckets(T, T, true, cfg).to(src.device())).permute({2, 0, 1}).unsqueeze(0);
    auto pad_keys = (src == kPad).view({src.size(0), 1, 1, T}).to(dtype) * neg;  // (B, 1, 1, T)
    auto x = shared(src);
    for (auto& block : encoder) x = block(x, enc_bias + pad_keys);
    auto memory = encoder_norm(x);
    // Decoder: the targets shifted right behind the start token, causal position bias and mask.
    auto dec_in = torch::cat({torch::full({tgt.size(0), 1}, kPad, tgt.options()), tgt.narrow(1, 0, T - 1)}, 1);
    auto causal = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(src.device())).triu(1);
    auto dec_bias = decoder_bias(relative_buckets(T, T, false, cfg).to(src.device())).permute({2, 0, 1}).unsqueeze(0) +
                    causal.to(dtype) * neg;
    auto y = shared(dec_in);
    for (auto& block : decoder) y = block(y, dec_bias, memory, pad_keys);
    y = decoder_norm(y) * (1.0 / std::sqrt(static_cast<double>(cfg.d_model)));  // tied output layer
    auto logits = y.matmul(shared->weight.t()).to(torch::kFloat);
    auto token_loss = torch::cross_entropy_loss(logits.view({-1, cfg.vocab}), tgt.reshape({-1}), {},
                                                at::Reduction::None)
                          .view(tgt.sizes());
    auto mask = (tgt != kPad).to(torch::kFloat);
    auto loss = ((token_loss * mask).sum(1) / mask.sum(1)).mean();
    return {loss, logits};
  }

  T5Config cfg;
  torch::nn::Embedding shared;        // (V, D)
  torch::nn::Embedding encoder_bias;  // (buckets, H)
  torch::nn::Embedding decoder_bias;  // (buckets, H)
  std::vector<fsdp::nn::Unit<EncoderBlockImpl>> encoder;
  std::vector<fsdp::nn::Unit<DecoderBlockImpl>> decoder;
  RmsNorm encoder_norm, decoder_norm;
};

// `batch` random strings of step `step` (the same on every process): src = letters, end; tgt =
// the letters reversed, end; both padded to T.
std::pair<torch::Tensor, torch::Tensor> make_batch(const T5Config& c, int64_t batch, uint64_t seed, int64_t step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003 + static_cast<uint64_t>(step));
  auto lengths = torch::randint(c.min_len, c.max_len + 1, {batch}, gen, torch::kLong);
  auto letters = torch::randint(kFirstLetter, c.vocab, {batch, c.max_len}, gen, torch::kLong);
  auto src = torch::full({batch, c.seq()}, kPad, torch::kLong);
  auto tgt = torch::full({batch, c.seq()}, kPad, torch::kLong);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t n = lengths[b].item<int64_t>();
    src[b].narrow(0, 0, n).copy_(letters[b].narrow(0, 0, n));
    tgt[b].narrow(0, 0, n).copy_(letters[b].narrow(0, 0, n).flip(0));
    src[b][n] = kEos;
    tgt[b][n] = kEos;
  }
  return {src, tgt};
}

std::string to_text(const torch::Tensor& ids) {
  std::string s;
  for (int64_t i = 0; i < ids.size(0); ++i) {
    const int64_t t = ids[i].item<int64_t>();
    if (t == kEos || t == kPad) break;
    s += static_cast<char>('a' + (t - kFirstLetter));
  }
  return s;
}

// Greedy decoding through the sharded model: one forward per output token (grad mode off).
void show(fsdp::nn::Unit<T5Impl>& model, const T5Config& c, int64_t n, uint64_t seed, at::Device device, int rank) {
  torch::NoGradGuard no_grad;
  auto [src, expected] = make_batch(c, n, seed + 1, /*step=*/-1);  // strings never trained on
  src = src.to(device);
  auto out = torch::full_like(src, kPad);
  for (int64_t i = 0; i < c.seq(); ++i) {
    auto logits = model(src, out)[1];  // position i sees the start token and out[0, i)
    out.select(1, i).copy_(logits.select(1, i).argmax(-1));
  }
  out = out.cpu();
  int64_t right = 0;
  for (int64_t b = 0; b < n; ++b) {
    const bool ok = to_text(out[b]) == to_text(expected[b]);
    right += ok ? 1 : 0;
    if (rank == 0)
      std::printf("%-12s -> %-12s %s\n", to_text(src[b].cpu()).c_str(), to_text(out[b]).c_str(), ok ? "" : "(wrong)");
  }
  if (rank == 0) std::printf("reversed %lld of %lld correctly\n", static_cast<long long>(right), static_cast<long long>(n));
}

struct Flags {
  int nproc = 1;
  int64_t steps = 300;
  int64_t batch = 32;  // global: split over the processes
  double lr = 3e-3;
  uint64_t seed = 0;
  int64_t show = 0;
  std::string device = "cpu";
};

int run(int argc, char** argv) {
  Flags f;
  CLI::App app{"A T5-style encoder-decoder trained with fsdp-cpp to reverse strings."};
  app.add_option("--nproc-per-node", f.nproc, "Processes to start on this machine (ignored under torchrun)");
  app.add_option("--steps", f.steps, "Optimizer steps")->check(CLI::NonNegativeNumber);
  app.add_option("--batch", f.batch, "Global batch (strings per step over all processes)")->check(CLI::PositiveNumber);
  app.add_option("--lr", f.lr, "AdamW learning rate");
  app.add_option("--seed", f.seed, "Seed of the model and the data");
  app.add_option("--show", f.show, "After training, reverse this many new strings greedily")->check(CLI::NonNegativeNumber);
  app.add_option("--device", f.device, "cpu | cuda (one GPU per process, NCCL)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());
    return 0;
  } catch (const CLI::ParseError& e) {
    throw fsdp::UsageError(std::string(e.what()) + " (see t5 --help)");
  }

  // Under torchrun (or Slurm, a PyTorchJob) a worker; on its own with --nproc-per-node 2, the
  // launcher of two workers running this same program.
  fsdp::comm::Job job = fsdp::comm::start_job("t5", argc, argv, f.nproc, f.device);
  if (job.launched) return *job.launched;
  const fsdp::comm::Runtime& rt = job.runtime;
  fsdp::FsdpOptions options;
  options.device = job.device;
  const int rank = rt.world.rank, world_size = rt.world.world_size;
  FSDP_CHECK(f.batch % world_size == 0, "--batch ", f.batch, " must be a multiple of the number of processes ",
             world_size, " (every process trains on an equal slice)");

  const T5Config cfg;
  torch::manual_seed(f.seed);  // the same initial model on every process
  auto model = fsdp::nn::make_unit<T5Impl>(cfg);
  // One unit per encoder block and per decoder block; the embedding, the position biases and
  // the final norms stay in the root.
  options.wrap = fsdp::WrapPolicy::by_type(
      {std::type_index(typeid(EncoderBlockImpl)), std::type_index(typeid(DecoderBlockImpl))});
  auto sharded = fsdp::fully_shard(model.ptr(), rt.world_group, options);
  fsdp::optim::AdamWOptions adamw;
  adamw.lr = f.lr;
  fsdp::optim::AdamW opt(adamw);
  opt.add_shards(sharded->shards());
  const fsdp::comm::ProcessGroupPtr& host_group = rt.cpu_group ? rt.cpu_group : rt.world_group;
  if (rank == 0)
    std::printf("t5: %d process(es), %lld units\n", world_size,
                static_cast<long long>(fsdp::count_units(sharded->units())));

  const int64_t local = f.batch / world_size;
  for (int64_t step = 0; step < f.steps; ++step) {
    auto [src, tgt] = make_batch(cfg, f.batch, f.seed, step);
    src = src.narrow(0, rank * local, local).to(options.device);
    tgt = tgt.narrow(0, rank * local, local).to(options.device);
    torch::Tensor loss = model(src, tgt)[0];
    loss.backward();
    const double norm = sharded->clip_grad_norm(1.0);
    opt.step();
    sharded->zero_grad();
    at::Tensor global = loss.detach().to(torch::kCPU, torch::kDouble).reshape({1});
    host_group->all_reduce(global, fsdp::comm::ReduceOp::kSum)->wait();
    if (rank == 0)
      std::printf("step %lld loss %.9g grad_norm %.9g\n", static_cast<long long>(step + 1),
                  global.item<double>() / world_size, norm);
  }
  if (f.show > 0) show(model, cfg, f.show, f.seed, options.device, rank);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return fsdp::run_main("t5", [&] { return run(argc, argv); }); }
