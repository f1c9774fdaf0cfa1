// Kernel-only comparison of ways to move scattered paged blocks GPU0 -> GPU1 (peer stores over
// NVLink), to choose the fused kernel's inner loop (target: >= 350 GB/s, >= 320 GB/s with <= 16
// CTAs). No daemon: the block tables and buffers are set up here, every variant moves the same
// 1 GiB, and the destination is checked after each variant. Prints one table.
//
// Variants:
//   slab    the production kernel's scheme (kernels/kv_copy.cu): 512 threads, 8 x 16-byte loads in
//           flight per thread over consecutive bytes of the stream, all loads before the stores.
//   warp    one warp per block piece: 16-byte vectors, 8 in flight per lane (4 KiB per warp step).
//   tma     Hopper bulk copies: per warp, lane 0 runs a ring of shared-memory stages; each piece is
//           cp.async.bulk global -> shared (mbarrier completion), then cp.async.bulk shared ->
//           peer global. The SMs only issue; the copy engine of each SM (TMA) moves the bytes.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tests/gpu/bench_check.h"

namespace {

using kvrail::gpu_bench::Check;

struct Job {
  const uint8_t* src;
  uint8_t* dst;
  const uint32_t* src_blocks;
  const uint32_t* dst_blocks;
  uint32_t num_blocks;
  uint32_t block_bytes;
  uint32_t piece_bytes;  // block_bytes split into pieces of this size (divides it)
  uint32_t pieces_per_block;
};

constexpr int kInFlight = 8;

__global__ void __launch_bounds__(512) SlabKernel(Job j) {
  const uint64_t total = static_cast<uint64_t>(j.num_blocks) * j.block_bytes;
  const uint32_t slab = blockDim.x * kInFlight * 16;
  const uint64_t slabs = (total + slab - 1) / slab;
  for (uint64_t s = blockIdx.x; s < slabs; s += gridDim.x) {
    int4 v[kInFlight];
    uint64_t to[kInFlight];
    bool ok[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      const uint64_t q = s * slab + (static_cast<uint64_t>(k) * blockDim.x + threadIdx.x) * 16;
      ok[k] = q < total;
      if (ok[k]) {
        const uint32_t b = static_cast<uint32_t>(q / j.block_bytes);
        const uint32_t off = static_cast<uint32_t>(q - static_cast<uint64_t>(b) * j.block_bytes);
        v[k] = *reinterpret_cast<const int4*>(
            j.src + static_cast<uint64_t>(j.src_blocks[b]) * j.block_bytes + off);
        to[k] = static_cast<uint64_t>(j.dst_blocks[b]) * j.block_bytes + off;
      }
    }
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      if (ok[k]) *reinterpret_cast<int4*>(j.dst + to[k]) = v[k];
    }
  }
}

// One warp per piece (piece_bytes a multiple of 32 * 16 * InFlight here): InFlight x 16 B per lane
// per step (8: the production kernel's 4 KiB step; 16: 8 KiB in flight per warp).
template <int InFlight = kInFlight>
__global__ void __launch_bounds__(512) WarpKernel(Job j) {
  const uint32_t lane = threadIdx.x & 31;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * (blockDim.x / 32);
  const uint64_t pieces = static_cast<uint64_t>(j.num_blocks) * j.pieces_per_block;
  for (uint64_t p = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; p < pieces; p += warps) {
    const uint32_t b = static_cast<uint32_t>(p / j.pieces_per_block);
    const uint32_t piece = static_cast<uint32_t>(p - static_cast<uint64_t>(b) * j.pieces_per_block);
    const uint64_t base = static_cast<uint64_t>(piece) * j.piece_bytes;
    const int4* from = reinterpret_cast<const int4*>(
        j.src + static_cast<uint64_t>(j.src_blocks[b]) * j.block_bytes + base);
    int4* to = reinterpret_cast<int4*>(
        j.dst + static_cast<uint64_t>(j.dst_blocks[b]) * j.block_bytes + base);
    const uint32_t vecs = j.piece_bytes / 16;
    for (uint32_t v0 = 0; v0 < vecs; v0 += 32 * InFlight) {
      int4 v[InFlight];
#pragma unroll
      for (int k = 0; k < InFlight; ++k) v[k] = from[v0 + k * 32 + lane];
#pragma unroll
      for (int k = 0; k < InFlight; ++k) to[v0 + k * 32 + lane] = v[k];
    }
  }
}

__device__ __forceinline__ uint32_t Smem(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// TMA ring per warp: `stages` buffers of piece_bytes each, lane 0 issues everything.
__global__ void TmaKernel(Job j, int stages) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ __align__(8) uint64_t bars[16 * 16];  // up to 16 warps x 16 stages
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const uint32_t warps_per_cta = blockDim.x / 32;
  uint8_t* ring = smem + static_cast<size_t>(warp) * stages * j.piece_bytes;
  uint64_t* bar = bars + warp * 16;
  if (lane == 0) {
    for (int s = 0; s < stages; ++s) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(Smem(&bar[s])));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncwarp();
  if (lane != 0) return;
  const uint64_t pieces = static_cast<uint64_t>(j.num_blocks) * j.pieces_per_block;
  const uint64_t first = static_cast<uint64_t>(blockIdx.x) * warps_per_cta + warp;
  const uint64_t step = static_cast<uint64_t>(gridDim.x) * warps_per_cta;
  const uint64_t mine = first < pieces ? (pieces - first + step - 1) / step : 0;
  auto addr = [&](uint64_t m, uint64_t* from, uint64_t* to) {
    const uint64_t p = first + m * step;
    const uint32_t b = static_cast<uint32_t>(p / j.pieces_per_block);
    const uint32_t piece = static_cast<uint32_t>(p - static_cast<uint64_t>(b) * j.pieces_per_block);
    const uint64_t base = static_cast<uint64_t>(piece) * j.piece_bytes;
    *from = reinterpret_cast<uint64_t>(
        j.src + static_cast<uint64_t>(j.src_blocks[b]) * j.block_bytes + base);
    *to = reinterpret_cast<uint64_t>(j.dst +
                                     static_cast<uint64_t>(j.dst_blocks[b]) * j.block_bytes + base);
  };
  auto load = [&](uint64_t m) {
    const int s = static_cast<int>(m % stages);
    uint64_t from, to;
    addr(m, &from, &to);
    const uint32_t b = Smem(&bar[s]);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b),
                 "r"(j.piece_bytes)
                 : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
            "r"(Smem(ring + static_cast<size_t>(s) * j.piece_bytes)),
        "l"(from), "r"(j.piece_bytes), "r"(b)
        : "memory");
  };
  for (uint64_t m = 0; m < mine && m < static_cast<uint64_t>(stages); ++m) load(m);
  for (uint64_t m = 0; m < mine; ++m) {
    const int s = static_cast<int>(m % stages);
    const uint32_t parity = static_cast<uint32_t>((m / stages) & 1);
    const uint32_t b = Smem(&bar[s]);
    uint32_t done = 0;
    while (!done) {
      asm volatile(
          "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, "
          "0, p; }"
          : "=r"(done)
          : "r"(b), "r"(parity)
          : "memory");
    }
    uint64_t from, to;
    addr(m, &from, &to);
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(to),
                 "r"(Smem(ring + static_cast<size_t>(s) * j.piece_bytes)), "r"(j.piece_bytes)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    // Refill the stage of the previous piece once its store has read the shared memory.
    if (m >= 1 && m - 1 + stages < mine) {
      asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
      load(m - 1 + stages);
    }
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

struct Setup {
  uint32_t block_bytes;
  uint32_t num_blocks;
  uint8_t* src;
  uint8_t* dst;
  uint32_t* src_blocks;
  uint32_t* dst_blocks;
  std::vector<uint32_t> host_src_blocks, host_dst_blocks;
};

double TimeIt(cudaStream_t stream, int reps, const std::function<void()>& launch) {
  cudaEvent_t a, b;
  Check(cudaEventCreate(&a), "event");
  Check(cudaEventCreate(&b), "event");
  launch();  // warm-up
  Check(cudaStreamSynchronize(stream), "warm-up");
  std::vector<double> ms_each;
  for (int r = 0; r < reps; ++r) {
    Check(cudaEventRecord(a, stream), "record");
    launch();
    Check(cudaEventRecord(b, stream), "record");
    Check(cudaEventSynchronize(b), "sync");
    float ms = 0;
    Check(cudaEventElapsedTime(&ms, a, b), "elapsed");
    ms_each.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return kvrail::gpu_bench::SpreadOf(ms_each).median;
}

// Enqueues `main_work` on `main` and, beside it, `other_work` on `other` (a stream of device
// `other_device`, which starts after everything enqueued on `main` before this call), then makes
// `main` wait for `other`: TimeIt's events on `main` then bracket both. `go` belongs to GPU0,
// `done` to `other_device`; both are the caller's, reused.
void ForkJoin(cudaStream_t main, cudaEvent_t go, cudaStream_t other, cudaEvent_t done,
              int other_device, const std::function<void()>& main_work,
              const std::function<void()>& other_work) {
  Check(cudaEventRecord(go, main), "record");
  main_work();
  Check(cudaSetDevice(other_device), "set device");
  Check(cudaStreamWaitEvent(other, go, 0), "wait");
  other_work();
  Check(cudaEventRecord(done, other), "record");
  Check(cudaSetDevice(0), "set device");
  Check(cudaStreamWaitEvent(main, done, 0), "wait");
}

// Samples 64 blocks of the destination and compares them with their sources (device memcpy).
bool Verify(const Setup& s) {
  std::vector<uint8_t> a(s.block_bytes), b(s.block_bytes);
  for (uint32_t i = 0; i < s.num_blocks; i += std::max(1u, s.num_blocks / 64)) {
    Check(cudaMemcpy(a.data(), s.src + uint64_t{s.host_src_blocks[i]} * s.block_bytes,
                     s.block_bytes, cudaMemcpyDefault),
          "verify");
    Check(cudaMemcpy(b.data(), s.dst + uint64_t{s.host_dst_blocks[i]} * s.block_bytes,
                     s.block_bytes, cudaMemcpyDefault),
          "verify");
    if (a != b) return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t moved = 1ull << 30;
  int count = 0;
  Check(cudaGetDeviceCount(&count), "device count");
  const int dst_dev = count > 1 ? 1 : 0;
  Check(cudaSetDevice(0), "set device");
  if (dst_dev != 0) Check(cudaDeviceEnablePeerAccess(dst_dev, 0), "peer access");
  cudaStream_t stream, peer_stream = nullptr, ce_stream = nullptr;
  Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  Check(cudaStreamCreateWithFlags(&ce_stream, cudaStreamNonBlocking), "copy-engine stream");
  // Fork/join events of the two-stream rows (ForkJoin): GPU0's, and the destination GPU's.
  cudaEvent_t go = nullptr, local_done = nullptr, peer_done = nullptr;
  Check(cudaEventCreateWithFlags(&go, cudaEventDisableTiming), "event");
  Check(cudaEventCreateWithFlags(&local_done, cudaEventDisableTiming), "event");
  if (dst_dev != 0) {
    // The destination GPU's own stream, for the push + pull rows (it loads from GPU0).
    Check(cudaSetDevice(dst_dev), "set device");
    Check(cudaDeviceEnablePeerAccess(0, 0), "peer access (pull)");
    Check(cudaStreamCreateWithFlags(&peer_stream, cudaStreamNonBlocking), "peer stream");
    Check(cudaEventCreateWithFlags(&peer_done, cudaEventDisableTiming), "event");
    Check(cudaSetDevice(0), "set device");
  }
  // Pools twice the moved size so that blocks scatter.
  const uint64_t pool = 2 * moved;
  uint8_t *src = nullptr, *dst = nullptr;
  Check(cudaMalloc(&src, pool), "src pool");
  Check(cudaSetDevice(dst_dev), "set device");
  Check(cudaMalloc(&dst, pool), "dst pool");
  Check(cudaSetDevice(0), "set device");
  {
    std::vector<uint32_t> pattern(pool / 4);
    for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint32_t>(i * 2654435761u);
    Check(cudaMemcpy(src, pattern.data(), pool, cudaMemcpyHostToDevice), "fill");
  }
  std::printf(
      "copy variants, GPU0 -> GPU%d, 1 GiB of randomly scattered blocks per launch, median of 5 "
      "(GB/s)\n",
      dst_dev);
  std::vector<int> ctas = {8, 16, 32, 64, 132};
  if (argc > 1) ctas = {std::atoi(argv[1])};
  {
    // Contiguous ceiling: one copy-engine memcpy of the same size.
    const double ms = TimeIt(stream, 5, [&] {
      Check(cudaMemcpyAsync(dst, src, moved, cudaMemcpyDefault, stream), "ceiling");
    });
    std::printf("contiguous cudaMemcpyAsync: %.1f GB/s\n\n", moved / (ms / 1e3) / 1e9);
  }
  std::printf("| block | variant | %s |\n",
              [&] {
                std::string h;
                for (size_t i = 0; i < ctas.size(); ++i)
                  h += (i ? " | " : "") + std::to_string(ctas[i]) + " CTAs";
                return h;
              }()
                  .c_str());
  std::printf("|---|---|%s\n",
              [&] {
                std::string h;
                for (size_t i = 0; i < ctas.size(); ++i) h += "---|";
                return h;
              }()
                  .c_str());
  std::mt19937 rng(7);
  for (uint32_t kib : {4u, 16u, 32u, 128u}) {
    Setup s;
    s.block_bytes = kib << 10;
    s.num_blocks = static_cast<uint32_t>(moved / s.block_bytes);
    s.src = src;
    s.dst = dst;
    std::vector<uint32_t> ids(pool / s.block_bytes);
    for (uint32_t i = 0; i < ids.size(); ++i) ids[i] = i;
    std::shuffle(ids.begin(), ids.end(), rng);
    s.host_src_blocks.assign(ids.begin(), ids.begin() + s.num_blocks);
    std::shuffle(ids.begin(), ids.end(), rng);
    s.host_dst_blocks.assign(ids.begin(), ids.begin() + s.num_blocks);
    Check(cudaMalloc(&s.src_blocks, s.num_blocks * 4), "table");
    Check(cudaMalloc(&s.dst_blocks, s.num_blocks * 4), "table");
    Check(cudaMemcpy(s.src_blocks, s.host_src_blocks.data(), s.num_blocks * 4,
                     cudaMemcpyHostToDevice),
          "table");
    Check(cudaMemcpy(s.dst_blocks, s.host_dst_blocks.data(), s.num_blocks * 4,
                     cudaMemcpyHostToDevice),
          "table");
    struct Variant {
      std::string name;
      std::function<void(int)> launch;
    };
    auto job = [&](uint32_t piece) {
      Job j{s.src,        s.dst,         s.src_blocks, s.dst_blocks,
            s.num_blocks, s.block_bytes, piece,        s.block_bytes / piece};
      return j;
    };
    std::vector<Variant> variants;
    variants.push_back(
        {"slab 512x8", [&](int n) { SlabKernel<<<n, 512, 0, stream>>>(job(s.block_bytes)); }});
    variants.push_back(
        {"warp 512 thr", [&](int n) { WarpKernel<><<<n, 512, 0, stream>>>(job(4096)); }});
    if (kib >= 8) {  // a piece must fit in a block
      variants.push_back({"warp 512 thr, 16 in flight (8 KiB steps)",
                          [&](int n) { WarpKernel<16><<<n, 512, 0, stream>>>(job(8192)); }});
    }
    for (int warps : {1, 2, 4}) {
      for (uint32_t piece_kib : {4u, 8u, 16u}) {
        if (piece_kib > kib) continue;
        const uint32_t piece = piece_kib << 10;
        const int stages = std::min<int>(16, static_cast<int>((192u << 10) / (warps * piece)));
        const size_t smem = static_cast<size_t>(warps) * stages * piece;
        Check(cudaFuncSetAttribute(TmaKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(smem)),
              "smem attribute");
        variants.push_back({"tma " + std::to_string(warps) + "w x " + std::to_string(stages) +
                                " x " + std::to_string(piece_kib) + "K",
                            [&, warps, stages, piece, smem](int n) {
                              TmaKernel<<<n, 32 * warps, smem, stream>>>(job(piece), stages);
                            }});
      }
    }
    // Push + pull: GPU0's SMs store the first `push` share of the blocks into GPU1 while GPU1's
    // SMs load the rest from GPU0, both at once (n CTAs on each GPU). Both move bytes GPU0 ->
    // GPU1 over the same links; a sum above the one-sided rows would mean the single kernel is
    // limited on its issuing side, not by NVLink.
    uint32_t* peer_tables = nullptr;
    if (dst_dev != 0) {
      Check(cudaSetDevice(dst_dev), "set device");
      Check(cudaMalloc(&peer_tables, 2ull * s.num_blocks * 4), "peer tables");
      Check(cudaMemcpy(peer_tables, s.host_src_blocks.data(), s.num_blocks * 4,
                       cudaMemcpyHostToDevice),
            "t");
      Check(cudaMemcpy(peer_tables + s.num_blocks, s.host_dst_blocks.data(), s.num_blocks * 4,
                       cudaMemcpyHostToDevice),
            "t");
      Check(cudaSetDevice(0), "set device");
      for (int push_pct : {50, 60}) {
        variants.push_back({"warp push " + std::to_string(push_pct) + "% + pull " +
                                std::to_string(100 - push_pct) + "%",
                            [&, push_pct](int n) {
                              const uint32_t pushed =
                                  static_cast<uint32_t>(uint64_t{s.num_blocks} * push_pct / 100);
                              Job push = job(4096);
                              push.num_blocks = pushed;
                              Job pull = job(4096);
                              pull.src_blocks = peer_tables + pushed;
                              pull.dst_blocks = peer_tables + s.num_blocks + pushed;
                              pull.num_blocks = s.num_blocks - pushed;
                              ForkJoin(
                                  stream, go, peer_stream, peer_done, dst_dev,
                                  [&] { WarpKernel<><<<n, 512, 0, stream>>>(push); },
                                  [&] { WarpKernel<><<<n, 512, 0, peer_stream>>>(pull); });
                            }});
      }
    }
    // Kernel + copy engines: GPU0's SMs store most blocks while its copy engines move the rest
    // (one cudaMemcpyBatchAsync on a second stream), both at once. The copy engines reach 396
    // GB/s on contiguous memory, the SMs ~370 on scattered blocks; a sum above 375 would mean
    // SM-issued stores, not the links, are the limit.
    std::vector<void*> ce_dsts;
    std::vector<const void*> ce_srcs;
    std::vector<size_t> ce_sizes;
    if (kib >= 32) {
      for (uint32_t i = 0; i < s.num_blocks; ++i) {
        ce_dsts.push_back(s.dst + uint64_t{s.host_dst_blocks[i]} * s.block_bytes);
        ce_srcs.push_back(s.src + uint64_t{s.host_src_blocks[i]} * s.block_bytes);
        ce_sizes.push_back(s.block_bytes);
      }
      for (int ce_pct : {10, 20, 30}) {
        variants.push_back(
            {"warp " + std::to_string(100 - ce_pct) + "% + copy engines " + std::to_string(ce_pct) +
                 "%",
             [&, ce_pct](int n) {
               const uint32_t by_kernel =
                   static_cast<uint32_t>(uint64_t{s.num_blocks} * (100 - ce_pct) / 100);
               Job j = job(4096);
               j.num_blocks = by_kernel;
               ForkJoin(
                   stream, go, ce_stream, local_done, 0,
                   [&] { WarpKernel<><<<n, 512, 0, stream>>>(j); },
                   [&] {
                     cudaMemcpyAttributes attrs{};
                     attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
                     attrs.flags = cudaMemcpyFlagPreferOverlapWithCompute;
                     size_t idx = 0;
                     Check(cudaMemcpyBatchAsync(
                               ce_dsts.data() + by_kernel, ce_srcs.data() + by_kernel,
                               ce_sizes.data() + by_kernel, s.num_blocks - by_kernel, &attrs, &idx,
                               1, ce_stream),
                           "batch copy");
                   });
             }});
      }
    }
    for (const Variant& v : variants) {
      std::string row = "| " + std::to_string(kib) + " KiB | " + v.name + " |";
      for (int n : ctas) {
        Check(cudaMemsetAsync(dst, 0, pool, stream), "poison");
        const double ms = TimeIt(stream, 5, [&] { v.launch(n); });
        Check(cudaGetLastError(), v.name.c_str());
        char cell[64];
        std::snprintf(cell, sizeof cell, " %.1f%s |", moved / (ms / 1e3) / 1e9,
                      Verify(s) ? "" : " WRONG");
        row += cell;
      }
      std::printf("%s\n", row.c_str());
      std::fflush(stdout);
    }
    cudaFree(s.src_blocks);
    cudaFree(s.dst_blocks);
    if (peer_tables != nullptr) cudaFree(peer_tables);
  }
  return 0;
}
