// Consumer readiness on the GPU (issue 6): a decode-side stream waits on kvraild's arrival flags
// with cuStreamWaitValue32 (client::CudaFlags::WaitOnStream) and copies each layer out the moment
// it is released; the copies must hold the whole layer. The producer writes layers on its own
// stream and raises ready flags with cuStreamWriteValue32. Runs on the GPU machine only.
//
// Guard against the earlier hang: every stream is non-blocking, everything is allocated before the
// first wait is enqueued, the producer is enqueued before anything waits on the host, and a wait
// still stuck after 20 s is released by writing the flags from the host (the test then fails
// instead of hanging).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "client/cuda_export.h"
#include "client/cuda_flags.h"
#include "client/kvrail_client.h"
#include "tests/gpu/prefill_sim.h"
#include "tests/harness/daemon_process.h"

namespace kvrail {
namespace {

constexpr uint32_t kLayers = 8, kParts = 2, kBlocks = 64, kTpb = 16, kHeads = 8, kDim = 128;
constexpr uint64_t kElem = uint64_t{kTpb} * kHeads * kDim * 2;  // 32 KiB per (layer, part, block)
constexpr uint64_t kLayerBytes = kElem * kBlocks * kParts;      // 4 MiB
constexpr uint32_t kArrival = 256;                                 // word index of arrival flags

v1::RegionSpec Paged(bool writable, const char* name) {
  v1::RegionSpec spec;
  spec.set_name(name);
  spec.set_writable(writable);
  *spec.mutable_paged_kv() = testing::MakeLayout(kLayers, kParts, kBlocks, kTpb, kHeads, kDim,
                                                 v1::DTYPE_BF16,
                                                 v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  return spec;
}

TEST_CASE("a consumer stream released by arrival flags sees every layer complete") {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    WARN("no CUDA device: skipped");
    return;
  }
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

  // Identity block tables: layer l of the destination is one contiguous 4 MiB span.
  std::vector<uint32_t> blocks(kBlocks);
  for (uint32_t i = 0; i < kBlocks; ++i) blocks[i] = i;
  v1::TransferSpec spec = client::MakeBlockTransfer(src_region->region_id(), blocks,
                                                    dst_region->region_id(), blocks);
  const uint32_t epoch = 7, seed = 3;
  spec.mutable_ready_flags()->set_region_id(flags_region->region_id());
  spec.mutable_ready_flags()->set_byte_offset(0);
  spec.mutable_ready_flags()->set_value(epoch);
  spec.mutable_arrival_flags()->set_region_id(flags_region->region_id());
  spec.mutable_arrival_flags()->set_byte_offset(4 * kArrival);
  spec.mutable_arrival_flags()->set_value(epoch);
  auto submitted = (*cl)->Submit(spec);
  INFO(submitted.status().ToString());
  REQUIRE(submitted.ok());

  // Consumer: wait for layer l's arrival flag, then copy the layer out (device -> pinned host).
  for (uint32_t l = 0; l < kLayers; ++l) {
    REQUIRE((*consumer_flags)->WaitOnStream(consumer, kArrival + l, epoch).ok());
    REQUIRE(cudaMemcpyAsync(snapshot + l * kLayerBytes, (*dst)->data() + l * kLayerBytes,
                            kLayerBytes, cudaMemcpyDeviceToHost, consumer) == cudaSuccess);
  }
  // Producer: write layer l (a kernel of known duration), then raise its ready flag.
  for (uint32_t l = 0; l < kLayers; ++l) {
    REQUIRE(gpu_test::LaunchPrefillLayer((*src)->data() + l * kLayerBytes, kLayerBytes, l, seed,
                                         200000, producer) == cudaSuccess);
    REQUIRE((*producer_flags)->SignalOnStream(producer, l, epoch).ok());
  }

  // The consumer stream must drain on its own; if it does not, release it from the host.
  const auto t0 = std::chrono::steady_clock::now();
  cudaError_t state = cudaErrorNotReady;
  while ((state = cudaStreamQuery(consumer)) == cudaErrorNotReady &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const bool released_by_flags = state == cudaSuccess;
  if (!released_by_flags) {
    for (uint32_t l = 0; l < kLayers; ++l) {
      __atomic_store_n(&words[kArrival + l], epoch, __ATOMIC_RELEASE);
    }
    cudaStreamSynchronize(consumer);
  }
  INFO("arrival flags: " << words[kArrival] << " ... " << words[kArrival + kLayers - 1]);
  REQUIRE(released_by_flags);
  REQUIRE(cudaStreamSynchronize(producer) == cudaSuccess);
  auto status = (*cl)->Wait(submitted->transfer_id(), absl::Seconds(30));
  REQUIRE(status.ok());
  REQUIRE(status->state() == v1::TRANSFER_STATE_SUCCEEDED);

  // Every snapshot, taken the moment its wait released, already holds its whole layer.
  for (uint32_t l = 0; l < kLayers; ++l) {
    uint64_t wrong = 0, first = kLayerBytes;
    for (uint64_t b = 0; b < kLayerBytes; ++b) {
      if (snapshot[l * kLayerBytes + b] != gpu_test::PrefillByte(b, l, seed)) {
        if (wrong++ == 0) first = b;
      }
    }
    INFO("layer " << l << ": " << wrong << " wrong bytes, first at " << first);
    CHECK(wrong == 0);
  }
  cudaFreeHost(snapshot);
  cudaStreamDestroy(producer);
  cudaStreamDestroy(consumer);
}

}  // namespace
}  // namespace kvrail
