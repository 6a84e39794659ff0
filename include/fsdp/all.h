// fsdp-cpp in one include: LibTorch's C++ API (<torch/torch.h>) and every public layer of the
// library — the sharding engine (fsdp.h), unit marks and initialization (nn/), process groups,
// rendezvous and the local launcher (comm/), the sharded optimizer, schedules and gradient scaler
// (optim/), sharded checkpoints, safetensors and Hugging Face / PEFT interchange (checkpoint/),
// tokenizers, datasets and loaders (data/), the Llama family, Mixtral, LoRA and the MLP (models/),
// the trainer (train/), errors and run_main (common/).
//
// A program that includes this header and links the CMake target fsdp::fsdp needs nothing else
// (docs/library.md). Including the layers' own headers instead compiles faster.
#pragma once

#include <torch/torch.h>

#include "fsdp/checkpoint/hf.h"
#include "fsdp/checkpoint/peft.h"
#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/checkpoint/sharded.h"
#include "fsdp/c10d.h"
#include "fsdp/comm/backends.h"
#include "fsdp/comm/c10d.h"
#include "fsdp/comm/launcher.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/comm/rendezvous.h"
#include "fsdp/common/device.h"
#include "fsdp/common/error.h"
#include "fsdp/common/main.h"
#include "fsdp/data/data.h"
#include "fsdp/fsdp.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/llama_config.h"
#include "fsdp/models/lora.h"
#include "fsdp/models/mlp.h"
#include "fsdp/models/moe.h"
#include "fsdp/models/registry.h"
#include "fsdp/nn/freeze.h"
#include "fsdp/nn/init.h"
#include "fsdp/nn/unit.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/optim/grad_scaler.h"
#include "fsdp/optim/lr_schedule.h"
#include "fsdp/train/trainer.h"
