// The GPU writes the completion, on one GPU: a real kvraild with the CUDA engine moves 16 MiB of
// scattered blocks between two regions of GPU0 and the client sees each transfer's end in its
// done word (ClientOptions::gpu_done_word) before the daemon's completion, every byte right; with
// KVRAIL_GPU_DONE_WORD=0 (and with the daemon's cuda_done_words off) no end comes from a word and
// every transfer still succeeds; the fallback store (a one-thread fencing kernel, where
// cuStreamWriteValue64 is missing) lands behind a copy on its stream. Each case reports SKIPPED
// without a GPU. About 10 s on an H100.
#include <cuda_runtime_api.h>
#include <signal.h>
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "client/cuda_export.h"
#include "client/kvrail_client.h"
#include "kernels/kv_copy.h"
#include "tests/gpu/gpu_skip.h"
#include "tests/harness/daemon_process.h"

namespace kvrail {
namespace {

constexpr uint64_t kBlock = 16 << 10;
constexpr uint32_t kPool = 2048, kMoved = 1024;  // 16 MiB moved of a 32 MiB pool

bool HaveGpu() { return gpu_test::HaveGpus(1, client::CudaDeviceCount()); }

v1::PagedKvLayout Layout() {
  v1::PagedKvLayout l;
  l.set_num_layers(1);
  l.set_num_parts(1);
  l.set_num_blocks(kPool);
  l.set_num_heads(1);
  l.set_head_dim(128);
  l.set_tokens_per_block(static_cast<uint32_t>(kBlock / (128 * 2)));
  l.set_dtype(v1::DTYPE_BF16);
  l.set_order(v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  return l;
}

// A kvraild (config text, "" for the defaults) and a client of it; GPU0 pools of kPool blocks.
struct Rig {
  testing::TempDir dir;
  testing::DaemonProcess daemon;
  std::unique_ptr<client::Client> client;
  std::unique_ptr<client::CudaBuffer> src, dst;
  v1::RegionInfo src_region, dst_region;
  std::vector<uint8_t> bytes;  // the source's

  explicit Rig(const std::string& config = "") {
    std::vector<std::string> args;
    if (!config.empty()) {
      const std::string path = dir.path() + "/kvraild.textproto";
      std::ofstream(path) << config << "\n";
      args = {"--config", path};
    }
    REQUIRE(daemon.Start(dir.path(), args));
    auto connected = client::Client::Connect(daemon.socket());
    REQUIRE(connected.ok());
    client = *std::move(connected);
    const uint64_t size = uint64_t{kPool} * kBlock;
    auto s = client::CudaBuffer::Create(0, size);
    auto d = client::CudaBuffer::Create(0, size);
    REQUIRE(s.ok());
    REQUIRE(d.ok());
    src = *std::move(s);
    dst = *std::move(d);
    bytes.resize(size);
    std::mt19937_64 rng(5);
    for (size_t i = 0; i < size; i += 8) {
      const uint64_t v = rng();
      std::memcpy(bytes.data() + i, &v, 8);
    }
    REQUIRE(src->CopyFromHost(0, bytes.data(), size).ok());
    REQUIRE(dst->CopyFromHost(0, std::vector<uint8_t>(size, 0xAB).data(), size).ok());
    v1::RegionSpec spec;
    *spec.mutable_paged_kv() = Layout();
    spec.set_name("src");
    auto sr = client::RegisterCudaRegion(*client, src->data(), size, spec);
    spec.set_name("dst");
    spec.set_writable(true);
    auto dr = client::RegisterCudaRegion(*client, dst->data(), size, spec);
    REQUIRE(sr.ok());
    REQUIRE(dr.ok());
    src_region = *sr;
    dst_region = *dr;
  }
  ~Rig() { daemon.Stop(SIGTERM); }

  // `n` transfers of kMoved scattered blocks, each polled (LocalStates, no call) until it ended;
  // every one must succeed and land byte for byte. Returns how many ends came from the word.
  uint64_t Run(int n) {
    std::mt19937_64 rng(11);
    const uint64_t hits_before = client->DoneWordHits();
    for (int i = 0; i < n; ++i) {
      std::vector<uint32_t> ids(kPool);
      for (uint32_t b = 0; b < kPool; ++b) ids[b] = b;
      std::shuffle(ids.begin(), ids.end(), rng);
      const std::vector<uint32_t> from(ids.begin(), ids.begin() + kMoved);
      std::shuffle(ids.begin(), ids.end(), rng);
      const std::vector<uint32_t> to(ids.begin(), ids.begin() + kMoved);
      v1::TransferSpec spec =
          client::MakeBlockTransfer(src_region.region_id(), from, dst_region.region_id(), to);
      spec.set_priority(v1::PRIORITY_CRITICAL);
      auto submitted = client->Submit(spec);
      REQUIRE(submitted.ok());
      const uint64_t id = submitted->transfer_id();
      int32_t state = 0;
      const absl::Time give_up = absl::Now() + absl::Seconds(30);
      while (absl::Now() < give_up) {
        client->LocalStates(&id, 1, &state);
        if (state >= v1::TRANSFER_STATE_SUCCEEDED) break;
      }
      INFO("transfer " << id);
      REQUIRE(state == v1::TRANSFER_STATE_SUCCEEDED);
      // Seen done (from the word or the queue): every byte is there already.
      std::vector<uint8_t> landed(uint64_t{kPool} * kBlock);
      REQUIRE(dst->CopyToHost(0, landed.data(), landed.size()).ok());
      for (uint32_t b = 0; b < kMoved; ++b) {
        INFO("block " << from[b] << " -> " << to[b]);
        REQUIRE(std::memcmp(landed.data() + to[b] * kBlock, bytes.data() + from[b] * kBlock,
                            kBlock) == 0);
      }
      // The daemon's own end agrees.
      auto status = client->Wait(id, absl::Seconds(30));
      REQUIRE(status.ok());
      CHECK(status->state() == v1::TRANSFER_STATE_SUCCEEDED);
    }
    return client->DoneWordHits() - hits_before;
  }

  std::string Engines() {
    auto stats = client->GetStats();
    REQUIRE(stats.ok());
    std::string out;
    for (const auto& e : stats->engines()) out += e + " | ";
    return out;
  }
};

TEST_CASE("the client sees a GPU transfer's end in its done word, before the daemon's") {
  if (!HaveGpu()) return;
  Rig rig;
  const int n = 20;
  const uint64_t hits = rig.Run(n);
  std::printf("done word: %llu of %d ends seen first in the word\n",
              static_cast<unsigned long long>(hits), n);
  // Polled without pause, the word (stored by the stream) is seen before the daemon's entry,
  // which follows only after the dispatcher saw the batch end and the transfer's record ended.
  CHECK(hits >= static_cast<uint64_t>(n) * 3 / 4);
  CHECK(rig.Engines().find("done words enqueued") != std::string::npos);
}

TEST_CASE("off in the client or in the daemon: no end from a word, every transfer succeeds") {
  if (!HaveGpu()) return;
  SECTION("KVRAIL_GPU_DONE_WORD=0") {
    setenv("KVRAIL_GPU_DONE_WORD", "0", 1);
    Rig rig;
    unsetenv("KVRAIL_GPU_DONE_WORD");
    CHECK(rig.Run(5) == 0);
  }
  SECTION("cuda_done_words: false") {
    Rig rig("cuda_done_words: false");
    CHECK(rig.Run(5) == 0);
    CHECK(rig.Engines().find("done words enqueued") == std::string::npos);
  }
}

TEST_CASE("the fallback store: a one-thread kernel's word lands behind the copy on its stream") {
  if (!HaveGpu()) return;
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  const size_t bytes = 64 << 20;
  void *a = nullptr, *b = nullptr, *host = nullptr, *mapped = nullptr;
  REQUIRE(cudaMalloc(&a, bytes) == cudaSuccess);
  REQUIRE(cudaMalloc(&b, bytes) == cudaSuccess);
  REQUIRE(cudaMemset(a, 0x5A, bytes) == cudaSuccess);
  REQUIRE(cudaMemset(b, 0, bytes) == cudaSuccess);
  REQUIRE(cudaHostAlloc(&host, 8, cudaHostAllocMapped) == cudaSuccess);
  REQUIRE(cudaHostGetDevicePointer(&mapped, host, 0) == cudaSuccess);
  *static_cast<volatile uint64_t*>(host) = 0;
  cudaStream_t stream;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream) == cudaSuccess);
  REQUIRE(kernels::LaunchDoneWordStore(reinterpret_cast<uint64_t>(mapped), 0x1234, stream).ok());
  // Polled from the CPU without synchronizing: the word comes, and the copy had ended by then.
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (__atomic_load_n(static_cast<uint64_t*>(host), __ATOMIC_ACQUIRE) != 0x1234 &&
         absl::Now() < give_up) {
  }
  CHECK(__atomic_load_n(static_cast<uint64_t*>(host), __ATOMIC_ACQUIRE) == 0x1234);
  // Read on the legacy stream, which does not wait for the non-blocking one: the copy's last
  // bytes are there because the copy ended before the word.
  std::vector<uint8_t> tail(4096);
  REQUIRE(cudaMemcpy(tail.data(), static_cast<uint8_t*>(b) + bytes - tail.size(), tail.size(),
                     cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(tail == std::vector<uint8_t>(tail.size(), 0x5A));
  // A misaligned word is refused before any launch.
  CHECK_FALSE(kernels::LaunchDoneWordStore(reinterpret_cast<uint64_t>(mapped) + 4, 1, stream).ok());
  CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
  cudaStreamDestroy(stream);
  cudaFreeHost(host);
  cudaFree(a);
  cudaFree(b);
}

}  // namespace
}  // namespace kvrail
