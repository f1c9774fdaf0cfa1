// The KVRAIL engine's VRAM path on a GPU machine, without NIXL's agent (the nixl-cu13 wheel's
// Python bindings are for CPython 3.11; the GPU machine has 3.12 and no PyPI): the engine is
// created as NIXL's plugin manager creates it, registers cudaMalloc memory (VRAM_SEG, over CUDA
// IPC) and a memfd (DRAM_SEG), and moves scattered blocks VRAM -> VRAM and DRAM -> VRAM through
// kvraild, as NIXL's agent would call it (prepXfer, postXfer, checkXfer, releaseReqH, loopback
// metadata). Checks every byte; exit 0 when all match.
//   vram_engine_check SOCKET
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client/cuda_export.h"
#include "plugins/nixl/kvrail_engine.h"

namespace {

using kvrail::nixl::KvrailEngine;

// A descriptor list filled here (NIXL's agent fills them in the plugin's real use).
class List : public nixlDescList<nixlMetaDesc> {
 public:
  explicit List(nixl_mem_t mem) { type = mem; }
  void Add(uintptr_t addr, size_t len, uint64_t dev, nixlBackendMD* md) {
    nixlMetaDesc d;
    d.addr = addr;
    d.len = len;
    d.devId = dev;
    d.metadataP = md;
    descs.push_back(d);
  }
};

bool Wait(KvrailEngine& engine, nixlBackendReqH* handle, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (true) {
    const nixl_status_t st = engine.checkXfer(handle);
    if (st == NIXL_SUCCESS) return true;
    if (st != NIXL_IN_PROG || std::chrono::steady_clock::now() > deadline) {
      fprintf(stderr, "FAIL %s: checkXfer %d\n", what, static_cast<int>(st));
      return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s SOCKET\n", argv[0]);
    return 2;
  }
  nixl_b_params_t params{{"socket", argv[1]}, {"granule_bytes", "4096"}};
  nixlBackendInitParams init;
  init.localAgent = "gpu-agent";
  init.type = "KVRAIL";
  init.customParams = &params;
  KvrailEngine engine(&init);
  if (engine.getInitErr()) return 1;

  constexpr size_t kBytes = 64 << 20, kBlock = 32 << 10, kBlocks = 512;
  auto gpu = kvrail::client::CudaBuffer::Create(0, kBytes);
  if (!gpu.ok()) {
    fprintf(stderr, "FAIL cudaMalloc: %s\n", gpu.status().ToString().c_str());
    return 1;
  }
  std::vector<uint8_t> pattern(kBytes);
  std::mt19937_64 rng(7);
  for (auto& b : pattern) b = static_cast<uint8_t>(rng());
  if (!(*gpu)->CopyFromHost(0, pattern.data(), kBytes).ok()) return 1;

  // Host memory: a memfd mapped shared, as an engine's pinned pool would be.
  const int fd = memfd_create("vram_check", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, kBytes) != 0) return 1;
  auto* host =
      static_cast<uint8_t*>(mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  if (host == MAP_FAILED) return 1;
  for (size_t i = 0; i < kBytes; ++i) host[i] = static_cast<uint8_t>(pattern[i] ^ 0x5a);

  nixlBlobDesc vram;
  vram.addr = reinterpret_cast<uintptr_t>((*gpu)->data());
  vram.len = kBytes;
  vram.devId = 0;
  nixlBlobDesc dram;
  dram.addr = reinterpret_cast<uintptr_t>(host);
  dram.len = kBytes;
  nixlBackendMD *vmd = nullptr, *dmd = nullptr, *vloc = nullptr;
  if (engine.registerMem(vram, VRAM_SEG, vmd) != NIXL_SUCCESS ||
      engine.registerMem(dram, DRAM_SEG, dmd) != NIXL_SUCCESS ||
      engine.loadLocalMD(vmd, vloc) != NIXL_SUCCESS) {
    fprintf(stderr, "FAIL registerMem\n");
    return 1;
  }

  // Scattered blocks: sources in the first half, destinations in the second, shuffled.
  std::vector<size_t> src(kBlocks), dst(kBlocks);
  for (size_t i = 0; i < kBlocks; ++i) src[i] = i, dst[i] = kBytes / 2 / kBlock + i;
  std::shuffle(src.begin(), src.end(), rng);
  std::shuffle(dst.begin(), dst.end(), rng);
  int failures = 0;
  for (const bool from_host : {false, true}) {
    List local(from_host ? DRAM_SEG : VRAM_SEG), remote(VRAM_SEG);
    for (size_t i = 0; i < kBlocks; ++i) {
      local.Add((from_host ? dram.addr : vram.addr) + src[i] * kBlock, kBlock, 0,
                from_host ? dmd : vmd);
      remote.Add(vram.addr + dst[i] * kBlock, kBlock, 0, vloc);
    }
    nixlBackendReqH* handle = nullptr;
    nixl_opt_b_args_t args;
    const auto start = std::chrono::steady_clock::now();
    if (engine.prepXfer(NIXL_WRITE, local, remote, "gpu-agent", handle, &args) != NIXL_SUCCESS) {
      fprintf(stderr, "FAIL prepXfer\n");
      return 1;
    }
    const nixl_status_t posted =
        engine.postXfer(NIXL_WRITE, local, remote, "gpu-agent", handle, &args);
    const bool ok = (posted == NIXL_SUCCESS || posted == NIXL_IN_PROG) &&
                    Wait(engine, handle, from_host ? "dram->vram" : "vram->vram");
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    engine.releaseReqH(handle);
    std::vector<uint8_t> back(kBytes);
    if (!ok || !(*gpu)->CopyToHost(0, back.data(), kBytes).ok()) return 1;
    size_t bad = 0;
    for (size_t i = 0; i < kBlocks; ++i) {
      const uint8_t* want = from_host ? host + src[i] * kBlock : pattern.data() + src[i] * kBlock;
      if (memcmp(back.data() + dst[i] * kBlock, want, kBlock) != 0) ++bad;
    }
    if (memcmp(back.data(), pattern.data(), kBytes / 2) != 0) ++bad;  // sources untouched
    printf("%s: %zu blocks of %zu KiB in one request, %.2f ms, %zu mismatching blocks\n",
           from_host ? "DRAM -> VRAM" : "VRAM -> VRAM", kBlocks, kBlock >> 10, ms, bad);
    failures += bad != 0;
  }
  engine.deregisterMem(vmd);
  engine.deregisterMem(dmd);
  munmap(host, kBytes);
  close(fd);
  printf(failures == 0 ? "PASS\n" : "FAIL\n");
  return failures == 0 ? 0 : 1;
}
