// The GPU stream wait on one GPU, in one process (no kvraild): from the end of a producer's last
// kernel (its stream then writes the ready flag, cuStreamWriteValue32, as client/cuda_flags.h does)
// to the end of the copy of that layer, measured on the GPU's global timer, for:
//   poll 20us   the daemon's mechanism today: a CPU thread polls the flag word (20 us sleeps,
//               1 ns timer slack) and launches the copy kernel (32 CTAs) when it is seen;
//   poll busy   the same without sleeping;
//   stream wait the copy kernel enqueued behind cuStreamWaitValue32 on the flag word;
//   persistent  a resident kernel of 4 (or 32) CTAs working through a queue of items in mapped
//               memory, each gated on the flag (polling it with __nanosleep(200)); an abort word
//               ends it.
// Then what a resident persistent kernel costs a co-running compute-bound kernel (FMA loops on
// every SM), idle-polling, against the kernel alone. Every wait has a host watchdog: a flag that
// does not arrive within 5 s is written from the host (and the run fails) instead of hanging.
// Usage: flag_wait_bench [reps] (default 50).
#include <cuda_runtime_api.h>
#include <sys/prctl.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "client/cuda_flags.h"
#include "tests/gpu/bench_check.h"
#include "tests/gpu/flag_wait_kernels.h"

namespace kvrail::gpu_bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Env {
  cudaStream_t producer = nullptr, daemon = nullptr;
  uint32_t* words = nullptr;  // [0] ready flag, [1] abort
  std::unique_ptr<client::CudaFlags> flags;
  const volatile unsigned* dev_flag = nullptr;
  const volatile unsigned* dev_abort = nullptr;
  unsigned long long* t_end = nullptr;   // mapped host, one per rep
  unsigned long long* t_done = nullptr;  // mapped host, one per rep
  unsigned* counters = nullptr;          // device
  void* src = nullptr;
  void* dst = nullptr;
  uint32_t epoch = 0;
  int failures = 0;
};

volatile uint32_t& Word(Env& e, int i) { return reinterpret_cast<volatile uint32_t*>(e.words)[i]; }

// Waits for `stream` with a watchdog: after 5 s the flag is written from the host (value `v`)
// and the abort word set, so the GPU work can end; returns false then.
bool SyncOrRelease(Env& e, cudaStream_t stream, uint32_t v) {
  const auto t0 = Clock::now();
  while (true) {
    const cudaError_t q = cudaStreamQuery(stream);
    if (q == cudaSuccess) return true;
    if (q != cudaErrorNotReady) Check(q, "cudaStreamQuery");
    if (Clock::now() - t0 > std::chrono::seconds(5)) {
      std::fprintf(stderr, "watchdog: flag value %u not consumed in 5 s; released from the host\n",
                   v);
      Word(e, 0) = v;
      Word(e, 1) = 1;
      Check(cudaStreamSynchronize(stream), "released stream");
      ++e.failures;
      return false;
    }
  }
}

struct Stats {
  double p50 = 0, p90 = 0, min = 0, max = 0;
};

Stats Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v[v.size() * 9 / 10], v[0], v.back()};
}

void Print(const char* how, uint64_t bytes, int ctas, const Stats& s) {
  std::printf("| %s | %s | %d | %.1f | %.1f | %.1f | %.1f |\n", how,
              bytes >= (1 << 20) ? (std::to_string(bytes >> 20) + " MiB").c_str()
                                 : (std::to_string(bytes >> 10) + " KiB").c_str(),
              ctas, s.p50, s.p90, s.min, s.max);
  std::fflush(stdout);
}

void SleepUs(long us) {
  timespec ts{0, us * 1000};
  nanosleep(&ts, nullptr);
}

// The CPU poller + launch (poll_us 0: busy).
Stats Poll(Env& e, uint64_t bytes, int reps, long poll_us) {
  std::vector<double> lat;
  for (int r = 0; r < reps; ++r) {
    const uint32_t v = ++e.epoch;
    Check(LaunchProducer(20000, &e.t_end[r], e.producer), "producer");
    if (!e.flags->SignalOnStream(e.producer, 0, v).ok()) std::exit(1);
    const auto t0 = Clock::now();
    while (static_cast<int32_t>(Word(e, 0) - v) < 0) {
      if (poll_us > 0) SleepUs(poll_us);
      if (Clock::now() - t0 > std::chrono::seconds(5)) {
        std::fprintf(stderr, "poll: flag %u never came\n", v);
        std::exit(1);
      }
    }
    Check(LaunchCopy(e.src, e.dst, bytes, 32, e.counters, &e.t_done[r], e.daemon), "copy");
    Check(cudaStreamSynchronize(e.daemon), "daemon");
    Check(cudaStreamSynchronize(e.producer), "producer");
    if (r >= 5) lat.push_back((e.t_done[r] - e.t_end[r]) / 1e3);
  }
  return Summarize(lat);
}

// The copy behind a stream-side wait on the flag.
Stats StreamWait(Env& e, uint64_t bytes, int reps) {
  std::vector<double> lat;
  for (int r = 0; r < reps; ++r) {
    const uint32_t v = ++e.epoch;
    if (!e.flags->WaitOnStream(e.daemon, 0, v).ok()) std::exit(1);
    Check(LaunchCopy(e.src, e.dst, bytes, 32, e.counters, &e.t_done[r], e.daemon), "copy");
    Check(LaunchProducer(20000, &e.t_end[r], e.producer), "producer");
    if (!e.flags->SignalOnStream(e.producer, 0, v).ok()) std::exit(1);
    if (!SyncOrRelease(e, e.daemon, v)) continue;
    Check(cudaStreamSynchronize(e.producer), "producer");
    if (r >= 5) lat.push_back((e.t_done[r] - e.t_end[r]) / 1e3);
  }
  return Summarize(lat);
}

// A resident kernel of `ctas` CTAs working through `reps` queued items.
Stats PersistentQueue(Env& e, uint64_t bytes, int reps, int ctas) {
  QueueItem* items = nullptr;
  Check(cudaHostAlloc(reinterpret_cast<void**>(&items), sizeof(QueueItem) * reps,
                      cudaHostAllocMapped),
        "items");
  const uint32_t first = e.epoch + 1;
  for (int r = 0; r < reps; ++r) {
    items[r] = QueueItem{e.src, e.dst, bytes, first + r, &e.t_done[r]};
  }
  Check(cudaMemset(e.counters, 0, 4 * reps), "counters");
  Word(e, 1) = 0;
  Check(LaunchPersistent(items, reps, e.dev_flag, e.dev_abort, e.counters, ctas, e.daemon),
        "persistent");
  for (int r = 0; r < reps; ++r) {
    // Spaced 100 us apart on the producer's stream (its kernels run one after another).
    Check(LaunchProducer(100000, &e.t_end[r], e.producer), "producer");
    if (!e.flags->SignalOnStream(e.producer, 0, first + r).ok()) std::exit(1);
  }
  e.epoch = first + reps - 1;
  std::vector<double> lat;
  if (SyncOrRelease(e, e.daemon, e.epoch)) {
    Check(cudaStreamSynchronize(e.producer), "producer");
    for (int r = 5; r < reps; ++r) lat.push_back((e.t_done[r] - e.t_end[r]) / 1e3);
  } else {
    Check(cudaStreamSynchronize(e.producer), "producer");
    lat.push_back(-1);
  }
  Check(cudaMemset(e.counters, 0, 4 * reps), "counters");
  Check(cudaFreeHost(items), "items");
  return Summarize(lat);
}

// FMA load alone vs beside an idle-polling persistent kernel of `ctas` CTAs (ms, median of 5).
void Interference(Env& e) {
  int sms = 0;
  Check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "SMs");
  float* out = nullptr;
  Check(cudaMalloc(reinterpret_cast<void**>(&out), 4 * sms * 8), "out");
  cudaStream_t load;
  Check(cudaStreamCreateWithFlags(&load, cudaStreamNonBlocking), "load stream");
  cudaEvent_t a, b;
  Check(cudaEventCreate(&a), "event");
  Check(cudaEventCreate(&b), "event");
  const auto time_load = [&]() {
    std::vector<double> ms;
    for (int i = 0; i < 6; ++i) {
      Check(cudaEventRecord(a, load), "record");
      Check(LaunchFma(sms * 8, 200000, out, load), "fma");
      Check(cudaEventRecord(b, load), "record");
      Check(cudaEventSynchronize(b), "fma sync");
      float t = 0;
      Check(cudaEventElapsedTime(&t, a, b), "elapsed");
      if (i > 0) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  const double alone = time_load();
  std::printf("\ncompute load (FMA loops, %d CTAs x 256 threads): alone %.3f ms\n", sms * 8, alone);
  QueueItem* item = nullptr;
  Check(cudaHostAlloc(reinterpret_cast<void**>(&item), sizeof(QueueItem), cudaHostAllocMapped),
        "item");
  for (int ctas : {4, 32}) {
    const uint32_t never = e.epoch + 1000000;  // a flag that does not come while the load runs
    item[0] = QueueItem{e.src, e.dst, 16, never, &e.t_done[0]};
    Word(e, 1) = 0;
    Check(cudaMemset(e.counters, 0, 4), "counters");
    Check(LaunchPersistent(item, 1, e.dev_flag, e.dev_abort, e.counters, ctas, e.daemon),
          "persistent");
    SleepUs(1000);
    const double with = time_load();
    Word(e, 1) = 1;  // abort: the resident kernel ends
    Check(cudaStreamSynchronize(e.daemon), "persistent end");
    std::printf("beside a resident persistent kernel of %d CTAs polling: %.3f ms (%+.2f%%)\n", ctas,
                with, 100 * (with / alone - 1));
  }
  const double again = time_load();
  std::printf("alone again: %.3f ms\n", again);
  Check(cudaFreeHost(item), "item");
  Check(cudaFree(out), "out");
}

int Main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 50;
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  Env e;
  Check(cudaSetDevice(0), "set device");
  Check(cudaStreamCreateWithFlags(&e.producer, cudaStreamNonBlocking), "producer stream");
  Check(cudaStreamCreateWithFlags(&e.daemon, cudaStreamNonBlocking), "daemon stream");
  e.words = static_cast<uint32_t*>(std::aligned_alloc(4096, 4096));
  std::memset(e.words, 0, 4096);
  e.flags = Must(client::CudaFlags::Map(e.words, 2, 0), "map flags");
  void* dev_words = nullptr;
  Check(cudaHostGetDevicePointer(&dev_words, e.words, 0), "flag device pointer");
  e.dev_flag = static_cast<const volatile unsigned*>(dev_words);
  e.dev_abort = e.dev_flag + 1;
  Check(cudaHostAlloc(reinterpret_cast<void**>(&e.t_end), 8 * reps, cudaHostAllocMapped), "t_end");
  Check(cudaHostAlloc(reinterpret_cast<void**>(&e.t_done), 8 * reps, cudaHostAllocMapped),
        "t_done");
  Check(cudaMalloc(reinterpret_cast<void**>(&e.counters), 4 * reps), "counters");
  Check(cudaMemset(e.counters, 0, 4 * reps), "counters");
  const uint64_t max_bytes = 16 << 20;
  Check(cudaMalloc(reinterpret_cast<void**>(&e.src), max_bytes), "src");
  Check(cudaMalloc(reinterpret_cast<void**>(&e.dst), max_bytes), "dst");
  Check(cudaMemset(e.src, 0x5C, max_bytes), "src fill");
  // Every kernel loaded before any wait is enqueued (lazy loading would synchronize the context
  // behind a pending wait: the one-GPU hang).
  Check(LaunchProducer(0, &e.t_end[0], e.producer), "warm producer");
  Check(LaunchCopy(e.src, e.dst, 4096, 32, e.counters, &e.t_done[0], e.daemon), "warm copy");
  Check(LaunchPersistent(nullptr, 0, e.dev_flag, e.dev_abort, e.counters, 4, e.daemon),
        "warm persistent");
  Check(LaunchFma(1, 1, static_cast<float*>(e.dst), e.daemon), "warm fma");
  Check(cudaDeviceSynchronize(), "warm-up");

  std::printf(
      "\nproducer's kernel end -> the layer's copy end (GPU global timer), one H200, one "
      "process, %d reps (first 5 dropped), us\n\n| mechanism | layer bytes | copy CTAs | "
      "p50 | p90 | min | max |\n|---|---|---|---|---|---|---|\n",
      reps);
  for (uint64_t bytes : {uint64_t{64} << 10, uint64_t{16} << 20}) {
    Print("CPU poller (20 us sleeps) + launch", bytes, 32, Poll(e, bytes, reps, 20));
    Print("CPU poller (busy) + launch", bytes, 32, Poll(e, bytes, reps, 0));
    Print("stream wait (cuStreamWaitValue32) + kernel", bytes, 32, StreamWait(e, bytes, reps));
    Print("persistent kernel, GPU-visible queue", bytes, 4, PersistentQueue(e, bytes, reps, 4));
    Print("persistent kernel, GPU-visible queue", bytes, 32, PersistentQueue(e, bytes, reps, 32));
  }
  Interference(e);
  std::printf("\nwatchdog releases: %d\n", e.failures);
  return e.failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace kvrail::gpu_bench

int main(int argc, char** argv) { return kvrail::gpu_bench::Main(argc, argv); }
