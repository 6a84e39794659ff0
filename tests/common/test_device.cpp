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
  EXPECT_NE(msg.find("--device 'tpu' is not one of: cpu, cuda"), std::string::npos) << msg;
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
