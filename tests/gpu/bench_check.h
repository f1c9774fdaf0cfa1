// Exit-on-error helpers for the GPU benchmark programs (not tests: a failed step ends the run
// with the reason on stderr): CUDA and status checks, the GPU pair a benchmark moves between
// (--src-gpu / --dst-gpu), and the spread of a row's runs (median, min, max).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"

namespace kvrail::gpu_bench {

inline void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "CUDA error in %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

template <typename T>
T Must(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, v.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(v);
}

// The GPU pair a benchmark moves between: sources on `src`, destinations on `dst`, GPU0 -> GPU0
// unless told.
struct GpuPair {
  int src = 0;
  int dst = 0;
  bool same() const { return src == dst; }
  std::string Name() const { return absl::StrFormat("GPU%d -> GPU%d", src, dst); }
};

// Takes --src-gpu N and --dst-gpu N (also --src-gpu=N) out of argv (the rest stays for the
// program's own flags, in order); defaults from KVRAIL_GPU_PAIR ("S,D", as tests/gpu/run.sh
// exports), else GPU0 -> GPU0. Exits 2 naming the flag on a bad value or a GPU that is not there;
// with two GPUs, makes `src` current and enables peer access both ways (exit 1 if there is none).
inline GpuPair TakeGpuPair(int* argc, char** argv) {
  GpuPair pair;
  if (const char* env = std::getenv("KVRAIL_GPU_PAIR"); env != nullptr && *env != '\0') {
    if (std::sscanf(env, "%d,%d", &pair.src, &pair.dst) != 2) {
      std::fprintf(stderr, "KVRAIL_GPU_PAIR: expected \"SRC,DST\", got \"%s\"\n", env);
      std::exit(2);
    }
  }
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string a = argv[i];
    int* target = nullptr;
    std::string value;
    for (const auto& [flag, field] : {std::pair<const char*, int*>{"--src-gpu", &pair.src},
                                      std::pair<const char*, int*>{"--dst-gpu", &pair.dst}}) {
      const std::string f = flag;
      if (a == f && i + 1 < *argc) {
        target = field;
        value = argv[++i];
      } else if (a.rfind(f + "=", 0) == 0) {
        target = field;
        value = a.substr(f.size() + 1);
      }
    }
    if (target == nullptr) {
      argv[out++] = argv[i];
      continue;
    }
    if (!absl::SimpleAtoi(value, target) || *target < 0) {
      std::fprintf(stderr, "%s: not a GPU index: \"%s\"\n", a.c_str(), value.c_str());
      std::exit(2);
    }
  }
  *argc = out;
  argv[out] = nullptr;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  for (const auto& [flag, device] : {std::pair<const char*, int>{"--src-gpu", pair.src},
                                     std::pair<const char*, int>{"--dst-gpu", pair.dst}}) {
    if (device >= count) {
      std::fprintf(stderr, "%s %d: this machine has %d GPU(s)\n", flag, device, count);
      std::exit(2);
    }
  }
  Check(cudaSetDevice(pair.src), "cudaSetDevice(--src-gpu)");
  if (!pair.same()) {
    for (const auto& [from, to] :
         {std::pair<int, int>{pair.src, pair.dst}, std::pair<int, int>{pair.dst, pair.src}}) {
      int can = 0;
      Check(cudaDeviceCanAccessPeer(&can, from, to), "cudaDeviceCanAccessPeer");
      if (can == 0) {
        std::fprintf(stderr, "GPU%d cannot reach GPU%d (no peer access)\n", from, to);
        std::exit(1);
      }
      Check(cudaSetDevice(from), "cudaSetDevice");
      const cudaError_t e = cudaDeviceEnablePeerAccess(to, 0);
      if (e != cudaErrorPeerAccessAlreadyEnabled) Check(e, "cudaDeviceEnablePeerAccess");
      cudaGetLastError();
    }
    Check(cudaSetDevice(pair.src), "cudaSetDevice(--src-gpu)");
  }
  return pair;
}

// The spread of one row's runs: its median (what the row reports), min and max.
struct Spread {
  double median = 0, min = 0, max = 0;
  size_t n = 0;
};
inline Spread SpreadOf(std::vector<double> v) {
  Spread s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.n = v.size();
  s.min = v.front();
  s.max = v.back();
  s.median = v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  return s;
}
// "350.2 (341.0-355.9)": the median, then min-max, each with `digits` decimals.
inline std::string Cell(const Spread& s, int digits = 1) {
  return absl::StrFormat("%.*f (%.*f-%.*f)", digits, s.median, digits, s.min, digits, s.max);
}

}  // namespace kvrail::gpu_bench
