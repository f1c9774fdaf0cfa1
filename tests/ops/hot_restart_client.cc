// A client process for hot_restart_test: keeps `BATCH` transfers in flight, round after round,
// from its own source pool into its own destination pool, and checks every byte of every
// round, until its stdin closes; then moves one more transfer on the same (old) regions and
// reports on stdout:
//   READY                      once its first batch is submitted
//   DONE transfers=N failed=F corrupt=C lost=0|1 lineage_kept=0|1 instance_changed=0|1
// Exit status 0 only when nothing failed, nothing was corrupt and the session was not lost.
//   hot_restart_client SOCKET BATCH SEED
// kv_fixture uses Catch2 assertions in helpers this program never calls; link Catch2 itself.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <poll.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "base/status.h"
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

int Main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: hot_restart_client SOCKET BATCH SEED\n");
    return 2;
  }
  const uint32_t batch = static_cast<uint32_t>(std::atoi(argv[2]));
  const uint32_t seed = static_cast<uint32_t>(std::atoi(argv[3]));
  auto c = client::Client::Connect(argv[1]);
  if (!c.ok()) return 3;
  auto before = (*c)->GetStats();
  if (!before.ok()) return 3;
  auto src = Register(**c, Layout(kBlocksPerTransfer), false, "hot-restart-source");
  auto dst = Register(**c, Layout(kBlocksPerTransfer * batch), true, "hot-restart-destination");
  if (!src.ok() || !dst.ok()) return 4;
  const uint64_t block_bytes = LayoutBytes(Layout(1));
  const uint64_t slot_bytes = block_bytes * kBlocksPerTransfer;
  uint8_t* const src_bytes = src->first->data();
  uint8_t* const dst_bytes = dst->first->data();
  for (uint64_t i = 0; i < slot_bytes; ++i) src_bytes[i] = static_cast<uint8_t>(i * 131 + seed);
  std::vector<uint32_t> src_blocks(kBlocksPerTransfer);
  for (uint32_t b = 0; b < kBlocksPerTransfer; ++b) src_blocks[b] = b;

  uint64_t transfers = 0, failed = 0, corrupt = 0;
  // One round: `count` transfers into slots [0, count), all submitted, then all waited for and
  // their slots compared with the source.
  auto round = [&](uint32_t count, bool announce) {
    std::memset(dst_bytes, kPoison, slot_bytes * count);
    std::vector<uint64_t> ids;
    for (uint32_t slot = 0; slot < count; ++slot) {
      std::vector<uint32_t> dst_blocks(kBlocksPerTransfer);
      for (uint32_t b = 0; b < kBlocksPerTransfer; ++b) {
        dst_blocks[b] = slot * kBlocksPerTransfer + b;
      }
      auto t = (*c)->Submit(client::MakeBlockTransfer(src->second, src_blocks, dst->second,
                                                      dst_blocks));
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
  const bool lineage_kept = after.ok() && after->lineage_id() == before->lineage_id() &&
                            !after->lineage_id().empty();
  const bool instance_changed = after.ok() && after->instance_id() != before->instance_id();
  std::cout << "DONE transfers=" << transfers << " failed=" << failed << " corrupt=" << corrupt
            << " lost=" << lost << " lineage_kept=" << lineage_kept
            << " instance_changed=" << instance_changed << std::endl;
  return failed == 0 && corrupt == 0 && !lost ? 0 : 1;
}

}  // namespace
}  // namespace kvrail::testing

int main(int argc, char** argv) { return kvrail::testing::Main(argc, argv); }
