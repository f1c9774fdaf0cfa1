// A client process for hot_restart_test: keeps `BATCH` transfers in flight, round after round,
// from its own source pool into its own destination pool, and checks every byte of every
// round, until its stdin closes; then moves one more transfer on the same (old) regions and
// reports on stdout:
//   READY                      once its first batch is submitted
//   DONE transfers=N failed=F corrupt=C lost=0|1 lineage_kept=0|1 instance_changed=0|1
// Exit status 0 only when nothing failed, nothing was corrupt and the session was not lost.
//   hot_restart_client SOCKET BATCH SEED [--cuda-device N]
// With --cuda-device both pools are GPU memory on device N (cudaMalloc, registered over CUDA
// IPC): the daemon must run the CUDA engine, every transfer must have run on it (one that did
// not counts as failed), and each round's destination is copied back to the host to be checked.
// kv_fixture uses Catch2 assertions in helpers this program never calls; link Catch2 itself.
#define CATCH_CONFIG_RUNNER
#include <poll.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include "base/status.h"
#include "client/cuda_export.h"
#include "tests/integration/kv_fixture.h"

namespace kvrail::testing {
namespace {

constexpr uint32_t kBlocksPerTransfer = 32;  // 32 KiB blocks: 1 MiB per transfer

v1::PagedKvLayout Layout(uint32_t blocks) {
  return MakeLayout(1, 1, blocks, 16, 8, 128, v1::DTYPE_BF16,
                    v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
}

bool StdinClosed() {
  pollfd p{0, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  char buffer[64];
  return ::read(0, buffer, sizeof(buffer)) <= 0;
}

absl::StatusOr<std::pair<std::unique_ptr<client::HostBuffer>, uint64_t>> Register(
    client::Client& c, const v1::PagedKvLayout& layout, bool writable, const char* name) {
  KVRAIL_ASSIGN_OR_RETURN(auto buffer, c.CreateHostBuffer(LayoutBytes(layout)));
  v1::RegionSpec spec;
  spec.set_name(name);
  spec.set_memory_kind(v1::MEMORY_KIND_HOST);
  spec.set_size_bytes(buffer->size());
  spec.set_writable(writable);
  *spec.mutable_paged_kv() = layout;
  KVRAIL_ASSIGN_OR_RETURN(v1::RegionInfo info, c.RegisterHostBuffer(*buffer, spec));
  return std::make_pair(std::move(buffer), info.region_id());
}

// A pool in GPU memory on `device`, registered over CUDA IPC.
absl::StatusOr<std::pair<std::unique_ptr<client::CudaBuffer>, uint64_t>> RegisterCuda(
    client::Client& c, int device, const v1::PagedKvLayout& layout, bool writable,
    const char* name) {
  KVRAIL_ASSIGN_OR_RETURN(auto buffer, client::CudaBuffer::Create(device, LayoutBytes(layout)));
  v1::RegionSpec spec;
  spec.set_name(name);
  spec.set_writable(writable);
  *spec.mutable_paged_kv() = layout;
  KVRAIL_ASSIGN_OR_RETURN(v1::RegionInfo info,
                          client::RegisterCudaRegion(c, buffer->data(), buffer->size(), spec));
  return std::make_pair(std::move(buffer), info.region_id());
}

int Main(int argc, char** argv) {
  int cuda_device = -1;
  if (argc == 6 && std::strcmp(argv[4], "--cuda-device") == 0) {
    cuda_device = std::atoi(argv[5]);
  } else if (argc != 4) {
    std::fprintf(stderr, "usage: hot_restart_client SOCKET BATCH SEED [--cuda-device N]\n");
    return 2;
  }
  const uint32_t batch = static_cast<uint32_t>(std::atoi(argv[2]));
  const uint32_t seed = static_cast<uint32_t>(std::atoi(argv[3]));
  auto c = client::Client::Connect(argv[1]);
  if (!c.ok()) return 3;
  auto before = (*c)->GetStats();
  if (!before.ok()) return 3;
  const uint64_t block_bytes = LayoutBytes(Layout(1));
  const uint64_t slot_bytes = block_bytes * kBlocksPerTransfer;
  std::vector<uint8_t> pattern(slot_bytes);
  for (uint64_t i = 0; i < slot_bytes; ++i) pattern[i] = static_cast<uint8_t>(i * 131 + seed);
  // Host mode: the pools themselves. CUDA mode: GPU pools; `dst_bytes` is the host copy of the
  // destination a round reads back.
  std::unique_ptr<client::HostBuffer> host_src, host_dst;
  std::unique_ptr<client::CudaBuffer> gpu_src, gpu_dst;
  uint64_t src_id = 0, dst_id = 0;
  std::vector<uint8_t> readback;
  const uint8_t* src_bytes = pattern.data();
  uint8_t* dst_bytes = nullptr;
  if (cuda_device < 0) {
    auto src = Register(**c, Layout(kBlocksPerTransfer), false, "hot-restart-source");
    auto dst = Register(**c, Layout(kBlocksPerTransfer * batch), true, "hot-restart-destination");
    if (!src.ok() || !dst.ok()) return 4;
    std::tie(host_src, src_id) = *std::move(src);
    std::tie(host_dst, dst_id) = *std::move(dst);
    std::memcpy(host_src->data(), pattern.data(), slot_bytes);
    dst_bytes = host_dst->data();
  } else {
    auto src =
        RegisterCuda(**c, cuda_device, Layout(kBlocksPerTransfer), false, "hot-restart-gpu-source");
    auto dst = RegisterCuda(**c, cuda_device, Layout(kBlocksPerTransfer * batch), true,
                            "hot-restart-gpu-destination");
    if (!src.ok() || !dst.ok()) {
      std::fprintf(stderr, "GPU regions: %s / %s\n", src.status().ToString().c_str(),
                   dst.status().ToString().c_str());
      return 4;
    }
    std::tie(gpu_src, src_id) = *std::move(src);
    std::tie(gpu_dst, dst_id) = *std::move(dst);
    if (!gpu_src->CopyFromHost(0, pattern.data(), slot_bytes).ok()) return 4;
    readback.resize(slot_bytes * batch);
    dst_bytes = readback.data();
  }
  std::vector<uint32_t> src_blocks(kBlocksPerTransfer);
  for (uint32_t b = 0; b < kBlocksPerTransfer; ++b) src_blocks[b] = b;

  uint64_t transfers = 0, failed = 0, corrupt = 0;
  // One round: `count` transfers into slots [0, count), all submitted, then all waited for and
  // their slots compared with the source.
  auto round = [&](uint32_t count, bool announce) {
    std::memset(dst_bytes, kPoison, slot_bytes * count);
    if (gpu_dst != nullptr && !gpu_dst->Fill(kPoison).ok()) {
      std::fprintf(stderr, "poisoning the GPU destination failed\n");
      failed += count;
      return;
    }
    std::vector<uint64_t> ids;
    for (uint32_t slot = 0; slot < count; ++slot) {
      std::vector<uint32_t> dst_blocks(kBlocksPerTransfer);
      for (uint32_t b = 0; b < kBlocksPerTransfer; ++b) {
        dst_blocks[b] = slot * kBlocksPerTransfer + b;
      }
      auto t = (*c)->Submit(client::MakeBlockTransfer(src_id, src_blocks, dst_id, dst_blocks));
      ++transfers;
      if (!t.ok()) {
        std::fprintf(stderr, "submit: %s\n", t.status().ToString().c_str());
        ++failed;
        ids.push_back(0);
        continue;
      }
      ids.push_back(t->transfer_id());
    }
    if (announce) std::cout << "READY" << std::endl;
    for (uint32_t slot = 0; slot < count; ++slot) {
      if (ids[slot] == 0) continue;
      auto s = (*c)->Wait(ids[slot], absl::Seconds(60));
      if (!s.ok() || s->state() != v1::TRANSFER_STATE_SUCCEEDED) {
        std::fprintf(stderr, "transfer %llu: %s\n", static_cast<unsigned long long>(ids[slot]),
                     s.ok() ? s->ShortDebugString().c_str() : s.status().ToString().c_str());
        ++failed;
        continue;
      }
      if (gpu_dst != nullptr && s->engine().rfind("cuda", 0) != 0) {
        std::fprintf(stderr, "transfer %llu ran on engine '%s', not the CUDA engine\n",
                     static_cast<unsigned long long>(ids[slot]), s->engine().c_str());
        ++failed;
        continue;
      }
      if (gpu_dst != nullptr &&
          !gpu_dst->CopyToHost(slot * slot_bytes, dst_bytes + slot * slot_bytes, slot_bytes).ok()) {
        std::fprintf(stderr, "reading slot %u back from the GPU failed\n", slot);
        ++failed;
        continue;
      }
      if (std::memcmp(dst_bytes + slot * slot_bytes, src_bytes, slot_bytes) != 0) ++corrupt;
    }
  };
  round(batch, true);
  while (!StdinClosed()) round(batch, false);
  // After the restart: one more transfer on the regions registered before it.
  round(1, false);
  auto after = (*c)->GetStats();
  if (!after.ok()) std::fprintf(stderr, "GetStats: %s\n", after.status().ToString().c_str());
  if ((*c)->session_lost()) std::fprintf(stderr, "session lost\n");
  const bool lost = (*c)->session_lost() || !after.ok();
  const bool lineage_kept =
      after.ok() && after->lineage_id() == before->lineage_id() && !after->lineage_id().empty();
  const bool instance_changed = after.ok() && after->instance_id() != before->instance_id();
  std::cout << "DONE transfers=" << transfers << " failed=" << failed << " corrupt=" << corrupt
            << " lost=" << lost << " lineage_kept=" << lineage_kept
            << " instance_changed=" << instance_changed << std::endl;
  return failed == 0 && corrupt == 0 && !lost ? 0 : 1;
}

}  // namespace
}  // namespace kvrail::testing

int main(int argc, char** argv) { return kvrail::testing::Main(argc, argv); }
