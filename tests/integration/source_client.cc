// A client process for tests/integration/process_test: registers a source pool filled with the
// test pattern, submits a transfer into an existing destination region, prints the transfer id,
// then either exits at once without cleaning up ("die") or waits for stdin to close ("stay").
//   source_client SOCKET DST_REGION_ID[:WRITE_GRANT] SEED die|stay [LAYERWISE_READY]
// With LAYERWISE_READY = n the transfer is layer-wise and the client marks layers [0, n) ready
// before it prints the id.
// kv_fixture uses Catch2 assertions in helpers this program never calls; link Catch2 itself.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "tests/integration/kv_fixture.h"

namespace kvrail::testing {

int Main(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    std::fprintf(stderr, "usage: source_client SOCKET DST_REGION_ID SEED die|stay [READY]\n");
    return 2;
  }
  auto c = client::Client::Connect(argv[1]);
  if (!c.ok()) return 3;
  const auto layout = ProcessTestLayout();
  auto buffer = (*c)->CreateHostBuffer(LayoutBytes(layout));
  if (!buffer.ok()) return 4;
  Pool src;
  src.buffer = *std::move(buffer);
  src.layout = layout;
  const auto blocks = ScatteredBlocks(layout.num_blocks(), kProcessTestBlocks, 21);
  FillPool(src, static_cast<uint32_t>(std::atoi(argv[3])), blocks,
           uint64_t{kProcessTestBlocks} * layout.tokens_per_block());
  v1::RegionSpec spec;
  spec.set_name("dying-source");
  spec.set_memory_kind(v1::MEMORY_KIND_HOST);
  spec.set_size_bytes(src.buffer->size());
  *spec.mutable_paged_kv() = layout;
  auto info = (*c)->RegisterHostBuffer(*src.buffer, spec);
  if (!info.ok()) return 5;
  // DST_REGION_ID[:GRANT]: the destination belongs to the test's session; its write grant
  // comes along, as a router would hand it over.
  const std::string dst_arg = argv[2];
  const size_t colon = dst_arg.find(':');
  auto transfer = client::MakeBlockTransfer(
      info->region_id(), blocks, std::strtoull(dst_arg.substr(0, colon).c_str(), nullptr, 10),
      ScatteredBlocks(layout.num_blocks(), kProcessTestBlocks, 22));
  if (colon != std::string::npos) transfer.mutable_dst()->set_grant(dst_arg.substr(colon + 1));
  transfer.set_layerwise(argc == 6);
  auto submitted = (*c)->Submit(transfer);
  if (!submitted.ok()) {
    std::fprintf(stderr, "%s\n", submitted.status().ToString().c_str());
    return 6;
  }
  if (argc == 6 && !(*c)->MarkReady(submitted->transfer_id(), 0, std::atoi(argv[5])).ok()) return 7;
  std::cout << submitted->transfer_id() << std::endl;
  if (std::string(argv[4]) == "die") std::_Exit(0);  // no unregister, no session close
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}

}  // namespace kvrail::testing

int main(int argc, char** argv) { return kvrail::testing::Main(argc, argv); }
