#include "fsdp/compressed_collectives.h"

#include "fsdp/common/error.h"

namespace fsdp::detail {

// Note [Wire formats]
// FsdpOptions::compression chooses what crosses the wire for a shard group's
// parameter all-gathers and gradient reduce-scatters (docs/compression.md
// states each contract):
//  - all-gather, bf16: the fp32 master shard is rounded to bf16 (nearest
//    even) into this rank's chunk of a bf16 buffer, the buffers are
//    gathered, and on arrival the whole buffer is widened into the unsharded
//    parameters. Masters and the optimizer stay fp32; compute runs in the
//    param dtype. (With param_dtype bf16 this is the native gather.)
//  - all-gather, int8: the shard is block-quantized with rounding to nearest
//    (Note [Block int8] in quantize.h: blocks on the flat parameter's grid,
//    cut at the chunk's ends) into its chunk; every chunk, this
//    rank's own included, is dequantized on arrival, so all ranks compute
//    with identical parameters.
//  - reduce-scatter, bf16 or int8: chunk j of the unsharded gradients is
//    encoded (bf16: nearest even; int8: stochastic rounding) and sent to rank
//    j by an all_to_all; the owner decodes the W chunks it received and sums
//    them in fp32 in rank order 0..W-1 (bit-identical wherever the job runs),
//    then divides by W. The mean is never rounded to the wire format: it lands
//    in fp32, directly in the gradient shard when that is fp32.
// The bytes each rank sends per peer are gather_wire_bytes / reduce_wire_bytes;
// the transport counts them (tests/fsdp/test_compression.cpp holds the two
// equal). HYBRID's replica all-reduce and NO_SHARD's all-reduce are not
// compressed. Stochastic rounding draws from a generator keyed by the job's
// seed, the iteration, the unit, the rank and the destination chunk: two runs
// of the same job round the same way.

namespace {

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

int64_t elem(at::ScalarType t) { return static_cast<int64_t>(c10::elementSize(t)); }

// `t` as contiguous fp32 (itself when it already is).
at::Tensor as_float(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat ? t.contiguous() : t.to(at::kFloat).contiguous();
}

}  // namespace

Wire wire_for(const FsdpOptions& o, int64_t iteration, const std::string& unit, int rank) {
  Wire w;
  w.gather = o.compression.all_gather;
  w.reduce = o.compression.reduce_scatter;
  w.block = o.compression.block_size;
  // A bf16 gather of bf16 parameters is the native one.
  if (w.gather == WireFormat::kBf16 && o.mixed_precision.param_dtype == at::kBFloat16) w.gather = WireFormat::kNative;
  w.seed = mix(o.seed) ^ mix(static_cast<uint64_t>(iteration) * 0x632BE59BD9B4E019ULL) ^ fnv1a(unit) ^
           mix(static_cast<uint64_t>(rank) + 0x1234567ULL);
  return w;
}

int64_t gather_wire_bytes(WireFormat f, int64_t n, at::ScalarType param_dtype, int64_t block) {
  switch (f) {
    case WireFormat::kNative: return n * elem(param_dtype);
    case WireFormat::kBf16: return n * 2;
    case WireFormat::kInt8: return int8_chunk_bytes(n, block);
  }
  return 0;
}

int64_t reduce_wire_bytes(WireFormat f, int64_t n, at::ScalarType reduce_dtype, int64_t block) {
  return gather_wire_bytes(f, n, reduce_dtype, block);
}

AllGather all_gather_encoded(comm::ProcessGroup& group, const at::Tensor& shard, const at::Tensor& full,
                             const Wire& wire) {
  const int64_t w = group.size();
  const int64_t me = group.rank();
  const int64_t n = shard.numel();
  FSDP_ASSERT(full.numel() == w * n, "all_gather_encoded: full ", full.numel(), " != ", w, " x ", n);
  AllGather g;
  g.issued = true;
  if (wire.gather == WireFormat::kBf16) {
    at::Tensor buf = at::empty({w * n}, full.options().dtype(at::kBFloat16));
    at::Tensor mine = buf.narrow(0, me * n, n);
    mine.copy_(shard, /*non_blocking=*/true);  // rounds to nearest even
    g.work = group.all_gather(buf, mine);
    g.arrive = [buf, full] {
      RawWriteGuard guard;
      full.copy_(buf);  // exact widening
    };
    return g;
  }
  FSDP_ASSERT(wire.gather == WireFormat::kInt8, "all_gather_encoded: native wire");
  FSDP_CHECK(full.device().is_cpu(), "int8 all-gather (FsdpOptions::compression) runs on the CPU process group; "
             "unsharded parameters on ", full.device(), " — use the bf16 all-gather there");
  const int64_t cb = int8_chunk_bytes(n, wire.block);
  at::Tensor buf = at::empty({w * cb}, full.options().dtype(at::kByte));
  const at::Tensor src = as_float(shard);
  quantize_int8(src.data_ptr<float>(), n, me * n, wire.block, Rounding::kNearest, 0,
                buf.data_ptr<uint8_t>() + me * cb);
  g.work = group.all_gather(buf, buf.narrow(0, me * cb, cb));
  const int64_t block = wire.block;
  g.arrive = [buf, full, n, cb, w, block] {
    const uint8_t* in = buf.data_ptr<uint8_t>();
    if (full.scalar_type() == at::kFloat) {
      // Straight into the parameters' bytes: no autograd version bump (as a collective writes).
      auto* out = static_cast<float*>(full.data_ptr());
      for (int64_t r = 0; r < w; ++r) dequantize_int8(in + r * cb, n, r * n, block, out + r * n);
      return;
    }
    at::Tensor wide = at::empty({w * n}, full.options().dtype(at::kFloat));
    for (int64_t r = 0; r < w; ++r) dequantize_int8(in + r * cb, n, r * n, block, wide.data_ptr<float>() + r * n);
    RawWriteGuard guard;
    full.copy_(wide);
  };
  return g;
}

void issue_encoded_reduction(Reduction& r, const at::Tensor& input, comm::ProcessGroup& group,
                             const at::Tensor& grad_shard, bool may_land_in_shard, MemoryLedger& ledger,
                             UnshardedPool* pool, const Wire& wire) {
  const int64_t w = group.size();
  const int64_t n = grad_shard.numel();
  FSDP_ASSERT(input.numel() == w * n, "issue_encoded_reduction: input ", input.numel(), " != ", w, " x ", n);
  FSDP_CHECK(input.device().is_cpu(), "the compressed reduce-scatter (FsdpOptions::compression) runs on the CPU "
             "process group; gradients on ", input.device(), " — use FsdpOptions::mixed_precision.reduce_dtype bf16 "
             "there");
  r.input = input;
  r.into_grad_shard = false;
  r.issued = true;
  if (may_land_in_shard && grad_shard.scalar_type() == at::kFloat && grad_shard.device() == input.device()) {
    r.output = grad_shard;
    r.into_grad_shard = true;
  } else {
    r.output = new_unsharded(pool, n, at::kFloat, input);
    r.hold(r.output, ledger);
  }
  const at::Tensor out = r.output;
  if (wire.reduce == WireFormat::kBf16) {
    const at::Tensor send = input.scalar_type() == at::kBFloat16 ? input : input.to(at::kBFloat16);
    at::Tensor recv = at::empty_like(send);
    r.work = group.all_to_all(recv, send);
    r.arrive = [send, recv, out, n, w] {
      at::NoGradGuard no_grad;
      out.copy_(recv.narrow(0, 0, n));
      for (int64_t j = 1; j < w; ++j) out.add_(recv.narrow(0, j * n, n));  // fp32 += bf16, in fp32
      out.div_(w);
    };
    return;
  }
  FSDP_ASSERT(wire.reduce == WireFormat::kInt8, "issue_encoded_reduction: native wire");
  const int64_t cb = int8_chunk_bytes(n, wire.block);
  at::Tensor send = at::empty({w * cb}, input.options().dtype(at::kByte));
  {
    const at::Tensor src = as_float(input);
    const float* x = src.data_ptr<float>();
    uint8_t* p = send.data_ptr<uint8_t>();
    for (int64_t j = 0; j < w; ++j) {
      quantize_int8(x + j * n, n, j * n, wire.block, Rounding::kStochastic,
                    mix(wire.seed + static_cast<uint64_t>(j)), p + j * cb);
    }
  }
  at::Tensor recv = at::empty_like(send);
  r.work = group.all_to_all(recv, send);
  const int64_t block = wire.block;
  const int64_t start = group.rank() * n;  // every chunk received is a contribution to this rank's shard
  r.arrive = [send, recv, out, n, w, cb, block, start] {
    const uint8_t* in = recv.data_ptr<uint8_t>();
    auto* acc = static_cast<float*>(out.data_ptr());
    dequantize_int8(in, n, start, block, acc);
    for (int64_t j = 1; j < w; ++j) dequantize_int8_add(in + j * cb, n, start, block, acc);
    at::NoGradGuard no_grad;
    out.div_(w);
  };
}

}  // namespace fsdp::detail
