// peer_batches: writes the batches fsdp-train reads, for a peer implementation
// (tests/peers/fsdp2_parity.py) to train on exactly the same data.
//
// Given the data options of an fsdp-train run, writes two NumPy .npy files of
// int64 token windows (T + 1 tokens a row: inputs row[0..T), targets row[1..T]):
//   <out>.global.npy  (S, G, T+1)       step s, global sample j in [0, G):
//                                        window sampler.sample(s*G + j)
//   <out>.ranks.npy   (S, A, W, B, T+1)  what rank r reads at micro-step a of step s,
//                                        through BatchSampler::get — the trainer's path
// G = B * W * A. Note [Global batch rule] in include/fsdp/data/sampler.h says rank r's
// micro-step a is global rows (a*W + r)*B .. +B; a peer that splits the global batch
// itself checks its split against the second file.
//
// Exit codes: 0 written, 2 bad usage, 1 I/O failure or a batch from get() that
// disagrees with its own samples() (a sampler bug).
#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "fsdp/common/error.h"
#include "fsdp/common/main.h"
#include "fsdp/data/dataset.h"
#include "fsdp/data/sampler.h"

namespace {

// A C-order little-endian int64 .npy file (format version 1.0).
void write_npy(const std::string& path, const std::vector<int64_t>& shape, const std::vector<int64_t>& values) {
  int64_t count = 1;
  for (const int64_t d : shape) count *= d;
  FSDP_ASSERT(count == static_cast<int64_t>(values.size()), "npy ", path, ": shape holds ", count, " values, got ",
              values.size());
  std::string dims;
  for (const int64_t d : shape) dims += std::to_string(d) + ", ";
  std::string header = "{'descr': '<i8', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Magic (6) + version (2) + header length (2) + header, padded with spaces to a
  // multiple of 64 and ended by '\n'.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) FSDP_FAIL("peer_batches: cannot write ", path, ": ", std::strerror(errno));
  out.write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(header.size());
  const char len_le[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  out.write(len_le, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  // x86-64 and aarch64 are little-endian, as '<i8' says.
  static_assert(sizeof(int64_t) == 8, "int64");
  out.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * 8));
  out.close();
  if (!out) FSDP_FAIL("peer_batches: writing ", path, " failed (disk full?)");
}

int run(int argc, char** argv) {
  std::string data_path, format = "bin", token_dtype = "u16", out;
  fsdp::data::SamplerOptions so;
  so.seq_len = 256;
  so.batch_size = 8;
  so.grad_accum = 1;
  so.seed = 1337;
  int64_t steps = 0;
  bool no_shuffle = false;

  CLI::App app{"peer_batches: write the global and per-rank batches of an fsdp-train run as .npy files"};
  app.add_option("--data", data_path, "training data, as fsdp-train's --data")->required();
  app.add_option("--data-format", format, "auto | bin (text formats need a tokenizer: not supported here)")
      ->check(CLI::IsMember({"auto", "bin"}))
      ->capture_default_str();
  app.add_option("--token-dtype", token_dtype, "u16 | u32")->capture_default_str();
  app.add_option("--seq-len", so.seq_len, "T")->capture_default_str();
  app.add_option("--batch-size", so.batch_size, "B: samples per rank per micro-batch")->capture_default_str();
  app.add_option("--world-size", so.world_size, "W")->capture_default_str();
  app.add_option("--grad-accum", so.grad_accum, "A")->capture_default_str();
  app.add_option("--seed", so.seed, "data order seed (fsdp-train --seed)")->capture_default_str();
  app.add_flag("--no-shuffle", no_shuffle, "as fsdp-train --no-shuffle");
  app.add_option("--steps", steps, "S: steps to write")->required();
  app.add_option("--out", out, "output prefix: <out>.global.npy and <out>.ranks.npy")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "peer_batches: error: " << e.what() << " (see peer_batches --help)\n";
    return fsdp::kExitUsage;
  }
  FSDP_CHECK(steps >= 1, "--steps must be >= 1, got ", steps);
  so.shuffle = !no_shuffle;

  fsdp::data::DatasetOptions dopt;
  dopt.path = data_path;
  dopt.format = fsdp::data::parse_data_format(format);
  dopt.token_dtype = fsdp::data::parse_token_dtype(token_dtype);
  const auto dataset = fsdp::data::load_dataset(dopt, /*tokenizer=*/nullptr);

  const int64_t T = so.seq_len, B = so.batch_size, W = so.world_size, A = so.grad_accum;
  std::vector<fsdp::data::BatchSampler> ranks;
  for (int64_t r = 0; r < W; ++r) {
    fsdp::data::SamplerOptions ro = so;
    ro.rank = r;
    ranks.emplace_back(dataset, ro);
  }
  const int64_t G = ranks.front().global_batch_size();
  const int64_t row = T + 1;

  std::vector<int64_t> global(static_cast<size_t>(steps * G * row));
  std::vector<int32_t> buf(static_cast<size_t>(row));
  for (int64_t s = 0; s < steps; ++s) {
    for (int64_t j = 0; j < G; ++j) {
      const auto sample = ranks.front().sample(s * G + j);
      dataset->read(sample.window * T, row, buf.data());
      int64_t* dst = global.data() + (s * G + j) * row;
      for (int64_t t = 0; t < row; ++t) dst[t] = buf[static_cast<size_t>(t)];
    }
  }

  std::vector<int64_t> per_rank(static_cast<size_t>(steps * A * W * B * row));
  for (int64_t s = 0; s < steps; ++s) {
    for (int64_t a = 0; a < A; ++a) {
      for (int64_t r = 0; r < W; ++r) {
        const fsdp::data::Batch batch = ranks[static_cast<size_t>(r)].get(s, a);
        const int64_t* in = batch.inputs.data_ptr<int64_t>();
        const int64_t* tgt = batch.targets.data_ptr<int64_t>();
        for (int64_t b = 0; b < B; ++b) {
          int64_t* dst = per_rank.data() + (((s * A + a) * W + r) * B + b) * row;
          for (int64_t t = 0; t < T; ++t) {
            // get() hands out inputs and targets separately; they must be one window shifted by one.
            if (t > 0 && in[b * T + t] != tgt[b * T + t - 1]) {
              FSDP_FAIL("peer_batches: step ", s, " micro-step ", a, " rank ", r, " row ", b, ": inputs[", t, "] = ",
                        in[b * T + t], " but targets[", t - 1, "] = ", tgt[b * T + t - 1],
                        " — get() does not return a shifted window");
            }
            dst[t] = in[b * T + t];
          }
          dst[T] = tgt[b * T + T - 1];
        }
      }
    }
  }

  write_npy(out + ".global.npy", {steps, G, row}, global);
  write_npy(out + ".ranks.npy", {steps, A, W, B, row}, per_rank);
  std::cout << "peer_batches: " << steps << " steps of global batch G = " << G << " (B " << B << " x W " << W
            << " x A " << A << ") x " << row << " tokens from " << dataset->describe() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return fsdp::run_main("peer_batches", [&] { return run(argc, argv); }); }
