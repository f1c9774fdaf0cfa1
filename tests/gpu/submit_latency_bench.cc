// The C++ client's half of the Python overhead benchmark (tests/gpu/python_overhead.py runs both
// against one kvraild): 16 MiB transfers from --src-gpu to --dst-gpu (GPU0 -> GPU0 by default),
// submit -> completion seen by the client (Submit + Wait on the session socket), one at a time.
// Prints one machine-readable line:
//   cxx p50_us=.. p99_us=.. min_us=.. max_us=.. n=..
// Usage: submit_latency_bench SOCKET [ITERATIONS] [--src-gpu N] [--dst-gpu N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "client/cuda_export.h"
#include "client/kvrail_client.h"
#include "tests/gpu/bench_check.h"

namespace kvrail {
namespace {

// [layer=1][part=2][block=512][token=16][head=8][dim=128] bf16: 32 KiB per block and part; 256
// blocks of both parts = 16 MiB per transfer.
v1::RegionSpec PoolSpec(const char* name, bool writable) {
  v1::RegionSpec spec;
  spec.set_name(name);
  spec.set_writable(writable);
  v1::PagedKvLayout* l = spec.mutable_paged_kv();
  l->set_num_layers(1);
  l->set_num_parts(2);
  l->set_num_blocks(512);
  l->set_tokens_per_block(16);
  l->set_num_heads(8);
  l->set_head_dim(128);
  l->set_dtype(v1::DTYPE_BF16);
  l->set_order(v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  return spec;
}

int Run(const std::string& socket, int iterations, const gpu_bench::GpuPair& pair) {
  constexpr size_t kPoolBytes = 2ull * 512 * 16 * 8 * 128 * 2;
  auto client = client::Client::Connect(socket);
  auto src = client::CudaBuffer::Create(pair.src, kPoolBytes);
  auto dst = client::CudaBuffer::Create(pair.dst, kPoolBytes);
  if (!client.ok() || !src.ok() || !dst.ok()) {
    std::fprintf(stderr, "setup failed\n");
    return 1;
  }
  auto src_region =
      client::RegisterCudaRegion(**client, (*src)->data(), kPoolBytes, PoolSpec("lat-src", false));
  auto dst_region =
      client::RegisterCudaRegion(**client, (*dst)->data(), kPoolBytes, PoolSpec("lat-dst", true));
  if (!src_region.ok() || !dst_region.ok()) {
    std::fprintf(stderr, "register failed: %s %s\n", src_region.status().ToString().c_str(),
                 dst_region.status().ToString().c_str());
    return 1;
  }
  std::vector<uint32_t> src_blocks(256), dst_blocks(256);
  for (uint32_t i = 0; i < 256; ++i) {
    src_blocks[i] = (i * 7) % 512;  // scattered, distinct
    dst_blocks[i] = 511 - i;
  }
  const v1::TransferSpec spec = client::MakeBlockTransfer(src_region->region_id(), src_blocks,
                                                          dst_region->region_id(), dst_blocks);
  std::vector<double> us;
  for (int i = 0; i < iterations + 20; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    auto submitted = (*client)->Submit(spec);
    if (!submitted.ok()) return 1;
    auto status = (*client)->Wait(submitted->transfer_id());
    const auto t1 = std::chrono::steady_clock::now();
    if (!status.ok() || status->state() != v1::TRANSFER_STATE_SUCCEEDED) return 1;
    if (i >= 20) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::sort(us.begin(), us.end());
  std::printf("cxx p50_us=%.1f p99_us=%.1f min_us=%.1f max_us=%.1f n=%zu\n", us[us.size() / 2],
              us[us.size() * 99 / 100], us.front(), us.back(), us.size());
  return 0;
}

}  // namespace
}  // namespace kvrail

int main(int argc, char** argv) {
  const kvrail::gpu_bench::GpuPair pair = kvrail::gpu_bench::TakeGpuPair(&argc, argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s SOCKET [ITERATIONS] [--src-gpu N] [--dst-gpu N]\n", argv[0]);
    return 2;
  }
  return kvrail::Run(argv[1], argc > 2 ? std::atoi(argv[2]) : 300, pair);
}
