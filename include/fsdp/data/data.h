// The data layer in one include: tokenizers, datasets, the distributed sampler,
// evaluation windows and the background loader. It knows nothing about models or
// sharding; it produces (B, T) int64 token tensors.
//
// Typical use (one rank of W):
//   auto tok = fsdp::data::make_tokenizer("byte");
//   auto train = fsdp::data::load_dataset({"build/data/corpus.jsonl"}, tok.get());
//   train->validate(model_vocab_size);
//   auto sampler = std::make_shared<fsdp::data::BatchSampler>(train, sampler_options);
//   fsdp::data::BackgroundLoader loader(sampler, /*start_step=*/resumed_step);
//   for (step ...) for (micro ...) { fsdp::data::Batch b = loader.next(); ... }
#pragma once

#include "fsdp/data/dataset.h"
#include "fsdp/data/loader.h"
#include "fsdp/data/pretokenize.h"
#include "fsdp/data/sampler.h"
#include "fsdp/data/tokenizer.h"
