// Test-only: page-aligned host memory registered with CUDA for the GPUs (mapped), as Lanes
// registers its staging; for the fabric's GPU tests. Thread contract: built and destroyed on one
// thread; the bytes are the test's to share.
#pragma once

#include <sys/mman.h>

#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "base/cuda/cuda_util.h"
#include "daemon/fabric/tile_copy.h"

namespace kvrail::gpu_test {

// `n` bytes rounded up to whole pages, mmap'd and pinned by fabric::PinForGpus; fails the test
// when either fails.
struct Staging {
  explicit Staging(size_t n) : bytes((n + 4095) / 4096 * 4096) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    data = static_cast<uint8_t*>(p);
    pin = fabric::PinForGpus(data, bytes);
    REQUIRE(pin.has_value());
  }
  ~Staging() {
    pin.reset();
    munmap(data, bytes);
  }
  size_t bytes;
  uint8_t* data = nullptr;
  std::optional<cuda::HostRegistration> pin;
};

}  // namespace kvrail::gpu_test
