// Consumer readiness on the GPU: a decode-side stream waits on kvraild's arrival flags
// with cuStreamWaitValue32 (client::CudaFlags::WaitOnStream) and copies each layer out the moment
// it is released; the copies must hold the whole layer. The producer writes layers on its own
// stream and raises ready flags with cuStreamWriteValue32. Runs on the GPU machine only.
//
// Why the one-GPU run hung: producer and consumer are streams of ONE process here, and
// the consumer's waits were enqueued before the producer's first kernel launch. Under lazy module
// loading (CUDA 12's default) that first launch loads the kernel's module, which may synchronize
// the whole context, i.e. wait for the consumer stream, which waits for flags only the producer's
// kernels lead to: the launch call itself never returned (the host-side release below was never
// reached, hence the 90 s timeout, with and without MPS). The producer's kernel is now loaded
// before any wait is enqueued (KVRAIL_FLAGS_NO_PRELOAD=1 leaves it out, to show the hang), and a
// watchdog thread, not the blocked main thread, releases a stuck wait from the host, so a
// regression fails in seconds instead of hanging. KVRAIL_FLAGS_ROUNDS (default 3) repeats the
// whole handover with fresh epochs and data in one daemon.
#include <cuda_runtime_api.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "client/cuda_export.h"
#include "client/cuda_flags.h"
#include "client/kvrail_client.h"
#include "tests/gpu/gpu_skip.h"
#include "tests/gpu/prefill_sim.h"
#include "tests/harness/daemon_process.h"

namespace kvrail {
namespace {

constexpr uint32_t kLayers = 8, kParts = 2, kBlocks = 64, kTpb = 16, kHeads = 8, kDim = 128;
constexpr uint64_t kElem = uint64_t{kTpb} * kHeads * kDim * 2;  // 32 KiB per (layer, part, block)
constexpr uint64_t kLayerBytes = kElem * kBlocks * kParts;      // 4 MiB
constexpr uint32_t kArrival = 256;                              // word index of arrival flags

v1::RegionSpec Paged(bool writable, const char* name) {
  v1::RegionSpec spec;
  spec.set_name(name);
  spec.set_writable(writable);
  *spec.mutable_paged_kv() =
      testing::MakeLayout(kLayers, kParts, kBlocks, kTpb, kHeads, kDim, v1::DTYPE_BF16,
                          v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  return spec;
}

TEST_CASE("a consumer stream released by arrival flags sees every layer complete") {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  if (!gpu_test::HaveGpus(1, devices)) return;
  const int consumer_device = devices > 1 ? 1 : 0;
  testing::TempDir dir;
  testing::DaemonProcess daemon;
  REQUIRE(daemon.Start(dir.path()));
  auto cl = client::Client::Connect(daemon.socket());
  REQUIRE(cl.ok());

  const uint64_t pool = kLayerBytes * kLayers;
  auto src = client::CudaBuffer::Create(0, pool);
  auto dst = client::CudaBuffer::Create(consumer_device, pool);
  REQUIRE(src.ok());
  REQUIRE(dst.ok());
  REQUIRE((*src)->Fill(0).ok());
  REQUIRE((*dst)->Fill(0xAB).ok());
  auto src_region = client::RegisterCudaRegion(**cl, (*src)->data(), pool, Paged(false, "prefill"));
  auto dst_region = client::RegisterCudaRegion(**cl, (*dst)->data(), pool, Paged(true, "decode"));
  REQUIRE(src_region.ok());
  REQUIRE(dst_region.ok());

  auto flag_buffer = (*cl)->CreateHostBuffer(4096);
  REQUIRE(flag_buffer.ok());
  std::memset((*flag_buffer)->data(), 0, 4096);
  auto* words = reinterpret_cast<uint32_t*>((*flag_buffer)->data());
  v1::RegionSpec flag_spec;
  flag_spec.set_name("flags");
  flag_spec.set_writable(true);
  auto flags_region = (*cl)->RegisterHostBuffer(**flag_buffer, flag_spec);
  REQUIRE(flags_region.ok());
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  auto producer_flags = client::CudaFlags::Map(words, 1024, 0);
  REQUIRE(producer_flags.ok());
  auto consumer_flags = client::CudaFlags::Map(words, 1024, consumer_device);
  REQUIRE(consumer_flags.ok());
  // Mapping for another GPU leaves the caller's current device where it was.
  int current = -1;
  REQUIRE(cudaGetDevice(&current) == cudaSuccess);
  CHECK(current == 0);

  // Everything the streams use exists before the first wait: snapshots in pinned memory.
  uint8_t* snapshot = nullptr;
  REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&snapshot), pool) == cudaSuccess);
  std::memset(snapshot, 0, pool);
  cudaStream_t producer = nullptr, consumer = nullptr;
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaSetDevice(consumer_device) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking) == cudaSuccess);

  // The producer's kernel is loaded before anything waits (see the top of this file).
  const bool preload = std::getenv("KVRAIL_FLAGS_NO_PRELOAD") == nullptr;
  if (preload) {
    REQUIRE(gpu_test::LaunchPrefillLayer((*src)->data(), 0, 0, 0, 0, producer) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(producer) == cudaSuccess);
  }
  const char* rounds_env = std::getenv("KVRAIL_FLAGS_ROUNDS");
  const int rounds = rounds_env != nullptr ? std::atoi(rounds_env) : 3;

  // Identity block tables: layer l of the destination is one contiguous 4 MiB span.
  std::vector<uint32_t> blocks(kBlocks);
  for (uint32_t i = 0; i < kBlocks; ++i) blocks[i] = i;
  int released_by_watchdog = 0;
  for (int round = 0; round < rounds; ++round) {
    // Fresh epoch and data every round: a stale layer or a stale flag shows.
    const uint32_t epoch = 7 + static_cast<uint32_t>(round),
                   seed = 3 + static_cast<uint32_t>(round);
    v1::TransferSpec spec =
        client::MakeBlockTransfer(src_region->region_id(), blocks, dst_region->region_id(), blocks);
    spec.mutable_ready_flags()->set_region_id(flags_region->region_id());
    spec.mutable_ready_flags()->set_byte_offset(0);
    spec.mutable_ready_flags()->set_value(epoch);
    spec.mutable_arrival_flags()->set_region_id(flags_region->region_id());
    spec.mutable_arrival_flags()->set_byte_offset(4 * kArrival);
    spec.mutable_arrival_flags()->set_value(epoch);
    auto submitted = (*cl)->Submit(spec);
    INFO("round " << round << ": " << submitted.status().ToString());
    REQUIRE(submitted.ok());

    // The watchdog releases the consumer from the host if the round is not done in 20 s, from
    // its own thread: the main thread may be the one that is stuck (inside a CUDA call).
    std::atomic<bool> round_done{false}, watchdog_fired{false};
    std::thread watchdog([&] {
      const auto t0 = std::chrono::steady_clock::now();
      while (!round_done.load() &&
             std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (round_done.load()) return;
      watchdog_fired = true;
      for (uint32_t l = 0; l < kLayers; ++l) {
        __atomic_store_n(&words[kArrival + l], epoch, __ATOMIC_RELEASE);
      }
    });

    // Consumer: wait for layer l's arrival flag, then copy the layer out (device -> pinned host).
    bool enqueued = true;
    for (uint32_t l = 0; l < kLayers; ++l) {
      enqueued = enqueued && (*consumer_flags)->WaitOnStream(consumer, kArrival + l, epoch).ok();
      enqueued =
          enqueued && cudaMemcpyAsync(snapshot + l * kLayerBytes, (*dst)->data() + l * kLayerBytes,
                                      kLayerBytes, cudaMemcpyDeviceToHost, consumer) == cudaSuccess;
    }
    // Producer: write layer l (a kernel of known duration), then raise its ready flag.
    for (uint32_t l = 0; l < kLayers; ++l) {
      enqueued =
          enqueued && gpu_test::LaunchPrefillLayer((*src)->data() + l * kLayerBytes, kLayerBytes, l,
                                                   seed, 200000, producer) == cudaSuccess;
      enqueued = enqueued && (*producer_flags)->SignalOnStream(producer, l, epoch).ok();
    }
    // The consumer stream must drain on its own (polled, so the watchdog's release also ends it).
    cudaError_t state = cudaErrorNotReady;
    while ((state = cudaStreamQuery(consumer)) == cudaErrorNotReady) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    round_done = true;
    watchdog.join();
    if (watchdog_fired) ++released_by_watchdog;
    INFO("round " << round << " arrival flags: " << words[kArrival] << " ... "
                  << words[kArrival + kLayers - 1]);
    REQUIRE(enqueued);
    REQUIRE(state == cudaSuccess);
    REQUIRE_FALSE(watchdog_fired);
    REQUIRE(cudaStreamSynchronize(producer) == cudaSuccess);
    auto status = (*cl)->Wait(submitted->transfer_id(), absl::Seconds(30));
    REQUIRE(status.ok());
    REQUIRE(status->state() == v1::TRANSFER_STATE_SUCCEEDED);

    // Every snapshot, taken the moment its wait released, already holds its whole layer.
    uint64_t wrong_total = 0;
    for (uint32_t l = 0; l < kLayers; ++l) {
      uint64_t wrong = 0, first = kLayerBytes;
      for (uint64_t b = 0; b < kLayerBytes; ++b) {
        if (snapshot[l * kLayerBytes + b] != gpu_test::PrefillByte(b, l, seed)) {
          if (wrong++ == 0) first = b;
        }
      }
      if (wrong != 0) {
        FAIL_CHECK("round " << round << " layer " << l << ": " << wrong << " wrong bytes, first at "
                            << first);
      }
      wrong_total += wrong;
    }
    REQUIRE(wrong_total == 0);
  }
  std::printf("flags_gpu_test: %d rounds passed (kernel preloaded: %s, watchdog releases: %d)\n",
              rounds, preload ? "yes" : "no", released_by_watchdog);
  cudaFreeHost(snapshot);
  cudaStreamDestroy(producer);
  cudaStreamDestroy(consumer);
}

}  // namespace
}  // namespace kvrail
