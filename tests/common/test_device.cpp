// The device layer on this build: CPU always; CUDA where the build has it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fsdp/common/device.h"
#include "fsdp/common/error.h"
#include "support/errors.h"

using fsdp::testing::usage_error_of;

TEST(Device, CpuWorkersTrainOnTheCpu) {
  EXPECT_EQ(fsdp::worker_device("cpu", 0), c10::Device(c10::kCPU));
  EXPECT_EQ(fsdp::worker_device("cpu", 7), c10::Device(c10::kCPU));  // the local rank picks no CPU
}

TEST(Device, UnknownKindNamesTheChoices) {
  const std::string msg = usage_error_of([] { fsdp::worker_device("tpu", 0); });
  EXPECT_NE(msg.find("worker_device: kind 'tpu' is not one of: cpu, cuda"), std::string::npos) << msg;
}

TEST(Device, CudaNeedsACudaBuildAndADevicePerLocalRank) {
  if (!fsdp::cuda_built()) {
    EXPECT_EQ(fsdp::cuda_device_count(), 0);
    const std::string msg = usage_error_of([] { fsdp::worker_device("cuda", 0); });
    EXPECT_NE(msg.find("CPU-only"), std::string::npos) << msg;
    EXPECT_NE(msg.find("scripts/gpu.sh"), std::string::npos) << msg;
    return;
  }
  const int n = fsdp::cuda_device_count();
  const std::string msg = usage_error_of([n] { fsdp::worker_device("cuda", n); });
  EXPECT_NE(msg.find("sees " + std::to_string(n) + " device"), std::string::npos) << msg;
  if (n > 0) EXPECT_EQ(fsdp::worker_device("cuda", 0), c10::Device(c10::kCUDA, 0));
}

// --device cuda:N: every local rank on GPU N (Note [Several ranks on one GPU]);
// plain cuda and cpu as above.
TEST(Device, ANamedGpuServesEveryLocalRank) {
  EXPECT_EQ(fsdp::worker_device(c10::Device(c10::kCPU), 3), c10::Device(c10::kCPU));
  if (!fsdp::cuda_built()) {
    const std::string msg = usage_error_of([] { fsdp::worker_device(c10::Device(c10::kCUDA, 0), 2); });
    EXPECT_NE(msg.find("CPU-only"), std::string::npos) << msg;
    return;
  }
  const int n = fsdp::cuda_device_count();
  if (n == 0) {  // a CUDA build without a GPU: the count is named either way
    const std::string msg = usage_error_of([] { fsdp::worker_device(c10::Device(c10::kCUDA, 0), 2); });
    EXPECT_NE(msg.find("sees 0 device"), std::string::npos) << msg;
    return;
  }
  for (int local_rank : {0, 1, 5}) EXPECT_EQ(fsdp::worker_device(c10::Device(c10::kCUDA, 0), local_rank),
                                             c10::Device(c10::kCUDA, 0));
  EXPECT_EQ(fsdp::worker_device(c10::Device(c10::kCUDA), 0), c10::Device(c10::kCUDA, 0));
  const std::string msg = usage_error_of([n] { fsdp::worker_device(c10::Device(c10::kCUDA, n), 0); });
  EXPECT_NE(msg.find("worker_device: kind cuda:" + std::to_string(n) + " is not a device of this process: it sees " +
                     std::to_string(n) + " CUDA device"),
            std::string::npos)
      << msg;
}

TEST(Device, CpuPeakMemorySeesAnAllocationAndResets) {
  const c10::Device cpu(c10::kCPU);
  fsdp::synchronize(cpu);  // nothing to wait for; must not throw
  ASSERT_GT(fsdp::reserved_memory_bytes(cpu), 0);
  if (!fsdp::reset_peak_memory(cpu)) GTEST_SKIP() << "this kernel does not allow resetting VmHWM";
  const int64_t before = fsdp::peak_memory_bytes(cpu);
  constexpr size_t kBytes = 64 << 20;
  std::vector<char> block(kBytes, 1);  // written: resident
  const int64_t during = fsdp::peak_memory_bytes(cpu);
  EXPECT_GE(during - before, static_cast<int64_t>(kBytes) * 9 / 10) << "before " << before << ", during " << during;
  EXPECT_EQ(block[kBytes - 1], 1);
}

// The MFU denominator: known data-center GPUs by the names CUDA reports, the
// more specific name first (a GH200 is not an H200, an H100 PCIe not an SXM).
TEST(Device, PeakFlopsOfKnownGpusAndNoneElsewhere) {
  EXPECT_DOUBLE_EQ(fsdp::peak_flops("NVIDIA H100 80GB HBM3", c10::kBFloat16), 989.4e12);
  EXPECT_DOUBLE_EQ(fsdp::peak_flops("NVIDIA H100 PCIe", c10::kBFloat16), 756.5e12);
  EXPECT_DOUBLE_EQ(fsdp::peak_flops("NVIDIA H100 NVL", c10::kHalf), 835.5e12);
  EXPECT_DOUBLE_EQ(fsdp::peak_flops("NVIDIA H200", c10::kBFloat16), 989.4e12);
  EXPECT_DOUBLE_EQ(fsdp::peak_flops("NVIDIA GH200 480GB", c10::kFloat), 66.9e12);
  EXPECT_DOUBLE_EQ(fsdp::peak_flops("NVIDIA A100-SXM4-80GB", c10::kFloat), 19.5e12);
  EXPECT_EQ(fsdp::peak_flops("NVIDIA A100-SXM4-80GB", c10::kDouble), 0);
  EXPECT_EQ(fsdp::peak_flops("NVIDIA GeForce RTX 4090", c10::kBFloat16), 0);
  EXPECT_EQ(fsdp::peak_flops(fsdp::device_model(c10::Device(c10::kCPU)), c10::kBFloat16), 0);
}
