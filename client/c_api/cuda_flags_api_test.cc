// The C ABI's CUDA readiness flags (kvrail_cuda_flags_*): argument checks and handle misuse answer
// with an error naming the argument and never crash, on a machine with or without a GPU. With a
// GPU the mapping works and signal/wait check the index; the stream behaviour itself is
// tests/gpu/flags_gpu_test.cc's and python/tests_gpu's.
#include <cstdint>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "client/c_api/kvrail.h"

namespace {

std::string LastMessage() { return kvrail_last_error_message(); }

TEST_CASE("cuda flags: bad arguments are named and leave *out NULL") {
  alignas(8) uint32_t words[8] = {};
  kvrail_cuda_flags* flags = reinterpret_cast<kvrail_cuda_flags*>(uintptr_t{77});
  CHECK(kvrail_cuda_flags_map(nullptr, 8, 0, &flags) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage().find("words") != std::string::npos);
  CHECK(flags == nullptr);
  CHECK(kvrail_cuda_flags_map(words, 8, 0, nullptr) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage().find("out") != std::string::npos);
  CHECK(kvrail_cuda_flags_map(words, 8, -1, &flags) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage().find("device") != std::string::npos);
  CHECK(kvrail_cuda_flags_map(words, 0, 0, &flags) == KVRAIL_INVALID_ARGUMENT);
  CHECK(kvrail_cuda_flags_map(reinterpret_cast<uint8_t*>(words) + 2, 4, 0, &flags) ==
        KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage().find("aligned") != std::string::npos);
  CHECK(flags == nullptr);
}

TEST_CASE("cuda flags: NULL, never issued and freed handles answer INVALID_ARGUMENT") {
  CHECK(kvrail_cuda_flags_signal(nullptr, nullptr, 0, 1) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "flags: NULL");
  auto* bogus = reinterpret_cast<kvrail_cuda_flags*>(uintptr_t{0x5eed});
  CHECK(kvrail_cuda_flags_wait(bogus, nullptr, 0, 1) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage().find("not a live kvrail_cuda_flags handle") != std::string::npos);
  kvrail_cuda_flags_free(nullptr);
  kvrail_cuda_flags_free(bogus);  // never issued: a no-op
}

TEST_CASE("cuda flags: mapping works with a GPU and fails cleanly without one") {
  std::vector<uint32_t> words(16, 0);
  kvrail_cuda_flags* flags = nullptr;
  const int rc = kvrail_cuda_flags_map(words.data(), 16, 0, &flags);
  if (rc != KVRAIL_OK) {
    // No GPU or driver here: the CUDA error, no handle.
    CHECK(flags == nullptr);
    CHECK_FALSE(LastMessage().empty());
    return;
  }
  REQUIRE(flags != nullptr);
  CHECK(kvrail_cuda_flags_signal(flags, nullptr, 16, 1) == KVRAIL_OUT_OF_RANGE);
  CHECK(kvrail_cuda_flags_wait(flags, nullptr, 99, 1) == KVRAIL_OUT_OF_RANGE);
  kvrail_cuda_flags_free(flags);
  kvrail_cuda_flags_free(flags);  // second free: a no-op
  CHECK(kvrail_cuda_flags_signal(flags, nullptr, 0, 1) == KVRAIL_INVALID_ARGUMENT);
}

}  // namespace
