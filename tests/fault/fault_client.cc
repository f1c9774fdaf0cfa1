// Helper process for fault_test: a client the test kills (SIGKILL) mid-transfer.
//   fault_client <socket> busy
//       registers a 64 MiB source and destination and submits 8 transfers between them (the
//       daemon runs them with small tiles on one thread, so they take a while); prints
//       "ready <id> <id> ...\n" once they run, then sleeps until killed.
//   fault_client <socket> producer <dst_region_id> <write_grant> <layers>
//       registers a source of the layout fault_test uses, fills it with PatternByte(77, ...),
//       submits a layer-wise transfer of all its blocks into the test's destination (with the
//       grant), marks layer 0 ready, prints "ready <id>\n" and sleeps until killed: the other
//       layers never become ready.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/kvrail_client.h"
#include "tests/fault/fault_layout.h"
#include "tests/harness/daemon_process.h"

namespace {

using kvrail::client::Client;
namespace v1 = kvrail::v1;

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "fault_client: %s\n", why.c_str());
  std::exit(2);
}

std::unique_ptr<kvrail::client::HostBuffer> Pool(Client& c, const v1::PagedKvLayout& layout,
                                                 bool writable, uint64_t* id) {
  const uint64_t bytes = kvrail::testing::LayoutBytes(layout);
  auto buffer = c.CreateHostBuffer(bytes);
  if (!buffer.ok()) Die(buffer.status().ToString());
  v1::RegionSpec spec;
  spec.set_memory_kind(v1::MEMORY_KIND_HOST);
  spec.set_size_bytes(bytes);
  spec.set_writable(writable);
  *spec.mutable_paged_kv() = layout;
  auto info = c.RegisterHostBuffer(**buffer, spec);
  if (!info.ok()) Die(info.status().ToString());
  *id = info->region_id();
  return *std::move(buffer);
}

[[noreturn]] void SleepForever() {
  std::fflush(stdout);
  for (;;) ::pause();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) Die("usage: fault_client <socket> busy|producer ...");
  auto connected = Client::Connect(argv[1]);
  if (!connected.ok()) Die(connected.status().ToString());
  Client& c = **connected;
  const std::string mode = argv[2];
  if (mode == "busy") {
    const v1::PagedKvLayout layout = kvrail::testing::MakeLayout(
        8, 2, 256, 16, 8, 128, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);  // 128 MiB
    uint64_t src = 0, dst = 0;
    auto s = Pool(c, layout, false, &src);
    auto d = Pool(c, layout, true, &dst);
    std::vector<uint32_t> blocks(256);
    for (uint32_t i = 0; i < 256; ++i) blocks[i] = i;
    std::string line = "ready";
    for (int i = 0; i < 8; ++i) {
      auto submitted = c.Submit(kvrail::client::MakeBlockTransfer(src, blocks, dst, blocks));
      if (!submitted.ok()) Die(submitted.status().ToString());
      absl::StrAppend(&line, " ", submitted->transfer_id());
    }
    std::printf("%s\n", line.c_str());
    SleepForever();
  }
  if (mode == "producer" && argc == 6) {
    const uint64_t dst = std::strtoull(argv[3], nullptr, 10);
    const uint32_t layers = static_cast<uint32_t>(std::atoi(argv[5]));
    const v1::PagedKvLayout layout = kvrail::testing::FaultLayout(layers);
    uint64_t src = 0;
    auto s = Pool(c, layout, false, &src);
    std::vector<uint32_t> blocks;
    for (uint32_t b = 0; b < kvrail::testing::kFaultBlocks; ++b) blocks.push_back(b);
    kvrail::testing::FillFaultPattern(layout, s->data());
    v1::TransferSpec spec = kvrail::client::MakeBlockTransfer(src, blocks, dst, blocks);
    spec.mutable_dst()->set_grant(argv[4]);
    spec.set_layerwise(true);
    auto submitted = c.Submit(spec);
    if (!submitted.ok()) Die(submitted.status().ToString());
    absl::Status ready = c.MarkReady(submitted->transfer_id(), 0, 1);
    if (!ready.ok()) Die(ready.ToString());
    std::printf("ready %llu\n", static_cast<unsigned long long>(submitted->transfer_id()));
    SleepForever();
  }
  Die("unknown mode " + mode);
}
