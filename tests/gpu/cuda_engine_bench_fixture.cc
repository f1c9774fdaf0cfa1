// The shared fixture of cuda_engine_bench (cuda_engine_bench_fixture.h).
#include "tests/gpu/cuda_engine_bench_fixture.h"

#include <cuda_runtime_api.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kvrail::engine_bench {

int g_src = 0;  // the source GPU (--src-gpu): source pools, the GEMM load, this process's streams

// A pool of `blocks` blocks of `block_bytes`: 1 layer, 1 part, 16 tokens, 1 head, bf16.
v1::PagedKvLayout BlockLayout(uint32_t blocks, uint64_t block_bytes) {
  v1::PagedKvLayout l;
  l.set_num_layers(1);
  l.set_num_parts(1);
  l.set_num_blocks(blocks);
  l.set_tokens_per_block(16);
  l.set_num_heads(1);
  l.set_head_dim(static_cast<uint32_t>(block_bytes / 16 / 2));
  l.set_dtype(v1::DTYPE_BF16);
  l.set_order(v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  return l;
}

std::vector<uint32_t> Scattered(uint32_t pool, uint32_t n, uint64_t seed) {
  std::vector<uint32_t> ids(pool);
  std::iota(ids.begin(), ids.end(), 0u);
  std::mt19937_64 rng(seed);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(n);
  return ids;
}

double Gbps(uint64_t bytes, double seconds) { return bytes / seconds / 1e9; }

// The text after `key` in the first GPU's line of GetStats' engines, up to `end` (exclusive) or
// the next engine; "?" when absent.
std::string EngineField(Daemon& d, const std::string& key, const std::string& end) {
  const std::string all = d.Engines();
  const size_t at = all.find(key);
  if (at == std::string::npos) return "?";
  const std::string rest = all.substr(at + key.size());
  return rest.substr(0, std::min(rest.find(end), rest.find(" | ")));
}

// The engine's account of the last job's batches ("N batches, GPU busy X of Y ms ...").
std::string LastJobBusy(Daemon& d) { return EngineField(d, "last job so far: ", ";"); }

// A client of `d` that submits over gRPC only (SubmitTransfer), as before the session socket
// carried submits; swap it into d.client for a measurement.
std::unique_ptr<client::Client> GrpcOnlyClient(Daemon& d) {
  ::setenv("KVRAIL_SUBMIT_VIA", "grpc", 1);
  auto c = Must(client::Client::Connect(d.process.socket()), "connect (gRPC only)");
  ::unsetenv("KVRAIL_SUBMIT_VIA");
  return c;
}

Pools MakePoolsWith(Daemon& d, const v1::PagedKvLayout& layout, uint32_t moved, bool dst_host,
                    int dst_device) {
  Pools p;
  p.moved = moved;
  p.pool_blocks = layout.num_blocks();
  const uint64_t bytes = testing::LayoutBytes(layout);
  p.block_bytes = bytes / p.pool_blocks;
  p.src = Must(client::CudaBuffer::Create(g_src, bytes), "alloc src");
  Check(cudaMemset(p.src->data(), 1, bytes), "memset");
  v1::RegionSpec spec;
  *spec.mutable_paged_kv() = layout;
  spec.set_name("bench-src");
  p.src_info = Must(client::RegisterCudaRegion(*d.client, p.src->data(), bytes, spec), "reg src");
  spec.set_name("bench-dst");
  spec.set_writable(true);
  if (dst_host) {
    p.host_dst = Must(d.client->CreateHostBuffer(bytes), "host dst");
    spec.set_memory_kind(v1::MEMORY_KIND_HOST);
    spec.set_size_bytes(bytes);
    p.dst_info = Must(d.client->RegisterHostBuffer(*p.host_dst, spec), "reg host dst");
  } else {
    p.dst = Must(client::CudaBuffer::Create(dst_device, bytes), "alloc dst");
    p.dst_info = Must(client::RegisterCudaRegion(*d.client, p.dst->data(), bytes, spec), "reg dst");
  }
  p.src_blocks = Scattered(p.pool_blocks, p.moved, 1);
  p.dst_blocks = Scattered(p.pool_blocks, p.moved, 2);
  // Grants of the pools' owner, so another client of the daemon (the gRPC-only rows) may move
  // them too; the owner's own transfers pass by ownership.
  p.src_grant =
      Must(d.client->CreateGrant(p.src_info.region_id(), v1::GRANT_ACCESS_READ, absl::Hours(24)),
           "grant src")
          .token();
  p.dst_grant =
      Must(d.client->CreateGrant(p.dst_info.region_id(), v1::GRANT_ACCESS_WRITE, absl::Hours(24)),
           "grant dst")
          .token();
  Check(cudaDeviceSynchronize(), "sync");
  Check(cudaSetDevice(g_src), "cudaSetDevice(--src-gpu)");
  return p;
}

Pools MakePools(Daemon& d, uint64_t block_bytes, uint64_t total, bool dst_host, int dst_device) {
  const uint32_t moved = static_cast<uint32_t>(total / block_bytes);
  return MakePoolsWith(d, BlockLayout(2 * moved, block_bytes), moved, dst_host, dst_device);
}

void Release(Daemon& d, Pools& p) {
  (void)d.client->UnregisterRegion(p.src_info.region_id());
  (void)d.client->UnregisterRegion(p.dst_info.region_id());
  if (p.tables_region != 0) (void)d.client->UnregisterRegion(p.tables_region);
}

// Writes both block tables into a registered host buffer once; later transfers reference them.
void UseTableRefs(Daemon& d, Pools& p) {
  const uint64_t bytes = 4 * (p.src_blocks.size() + p.dst_blocks.size());
  p.tables = Must(d.client->CreateHostBuffer(bytes), "tables buffer");
  std::memcpy(p.tables->data(), p.src_blocks.data(), 4 * p.src_blocks.size());
  std::memcpy(p.tables->data() + 4 * p.src_blocks.size(), p.dst_blocks.data(),
              4 * p.dst_blocks.size());
  v1::RegionSpec spec;
  spec.set_name("bench block tables");
  p.tables_region = Must(d.client->RegisterHostBuffer(*p.tables, spec), "reg tables").region_id();
}

Phases last_phases;

double UnixUs() { return absl::ToDoubleMicroseconds(absl::Now() - absl::UnixEpoch()); }

// The transfer of the first `blocks` entries of the pools' block tables.
v1::TransferSpec SpecFor(const Pools& p, uint32_t blocks) {
  if (p.tables_region != 0) {
    v1::TransferSpec spec =
        client::MakeBlockTransfer(p.src_info.region_id(), {}, p.dst_info.region_id(), {});
    auto* s = spec.mutable_src()->mutable_block_table();
    s->set_region_id(p.tables_region);
    s->set_offset_bytes(0);
    s->set_count(blocks);
    auto* t = spec.mutable_dst()->mutable_block_table();
    t->set_region_id(p.tables_region);
    t->set_offset_bytes(4 * p.src_blocks.size());
    t->set_count(blocks);
    spec.set_num_tokens(uint64_t{blocks} * 16);
    return spec;  // block tables in the owner's memory: the owner's transfers only
  }
  std::vector<uint32_t> s(p.src_blocks.begin(), p.src_blocks.begin() + blocks);
  std::vector<uint32_t> t(p.dst_blocks.begin(), p.dst_blocks.begin() + blocks);
  v1::TransferSpec spec =
      client::MakeBlockTransfer(p.src_info.region_id(), s, p.dst_info.region_id(), t);
  spec.set_num_tokens(uint64_t{blocks} * 16);
  spec.mutable_src()->set_grant(p.src_grant);
  spec.mutable_dst()->set_grant(p.dst_grant);
  return spec;
}

// One transfer of `blocks` blocks through kvraild; returns seconds (submit to completion).
double Through(Daemon& d, const Pools& p, uint32_t blocks, std::string* engine, std::string* path) {
  const v1::TransferSpec spec = SpecFor(p, blocks);
  const auto t0 = Clock::now();
  const double u0 = UnixUs();
  auto sub = Must(d.client->Submit(spec), "submit");
  const double u1 = UnixUs();
  auto st = Must(d.client->Wait(sub.transfer_id()), "wait");
  const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  const double u2 = UnixUs();
  last_phases.submit_ms = (u1 - u0) / 1e3;
  last_phases.queued_ms = (st.started_unix_us() - st.submitted_unix_us()) / 1e3;
  last_phases.running_ms = (st.finished_unix_us() - st.started_unix_us()) / 1e3;
  last_phases.notify_ms = (u2 - st.finished_unix_us()) / 1e3;
  last_phases.to_daemon_ms = (st.received_unix_us() - u0) / 1e3;
  last_phases.accept_ms = (st.submitted_unix_us() - st.received_unix_us()) / 1e3;
  last_phases.reply_ms = (u1 - st.submitted_unix_us()) / 1e3;
  if (st.state() != v1::TRANSFER_STATE_SUCCEEDED) {
    std::fprintf(stderr, "transfer failed: %s\n", st.error_message().c_str());
    std::exit(1);
  }
  if (engine) *engine = st.engine();
  if (path) *path = v1::Path_Name(st.path());
  return sec;
}

// GB/s of `reps` transfers (after one warm-up): median, min, max.
Spread ThroughSpread(Daemon& d, const Pools& p, int reps, std::string* engine, std::string* path) {
  Through(d, p, p.moved, engine, path);
  std::vector<double> gbps;
  for (int i = 0; i < reps; ++i) {
    gbps.push_back(
        Gbps(uint64_t{p.moved} * p.block_bytes, Through(d, p, p.moved, nullptr, nullptr)));
  }
  return SpreadOf(gbps);
}

// Sustained rate: `count` transfers of the pools' blocks with two in flight (the next is
// submitted while the previous runs, as a prefill server hands over request after request), in
// GB/s from the first submit to the last completion. The same destination blocks each time (the
// same bytes land there); the per-transfer submit and completion then overlap other work.
double Pipelined(Daemon& d, const Pools& p, int count) {
  const v1::TransferSpec spec = SpecFor(p, p.moved);
  const auto t0 = Clock::now();
  std::deque<uint64_t> ids;
  for (int i = 0; i < count; ++i) {
    ids.push_back(Must(d.client->Submit(spec), "submit").transfer_id());
    if (ids.size() == 2) {
      const auto st = Must(d.client->Wait(ids.front()), "wait");
      if (st.state() != v1::TRANSFER_STATE_SUCCEEDED) std::exit(1);
      ids.pop_front();
    }
  }
  for (uint64_t id : ids) {
    if (Must(d.client->Wait(id), "wait").state() != v1::TRANSFER_STATE_SUCCEEDED) std::exit(1);
  }
  const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  return Gbps(uint64_t{p.moved} * p.block_bytes * count, sec);
}

// GB/s of `bytes` moved by `body` on a stream of the current device, each of `reps` runs timed
// with events (after one warm-up): median, min, max.
Spread TimeStream(const std::function<void(cudaStream_t)>& body, int reps, uint64_t bytes) {
  cudaStream_t s;
  Check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  body(s);
  Check(cudaStreamSynchronize(s), "warm-up");
  std::vector<double> gbps;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a, s);
    body(s);
    cudaEventRecord(b, s);
    Check(cudaEventSynchronize(b), "sync");
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    gbps.push_back(Gbps(bytes, ms / 1e3));
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaStreamDestroy(s);
  return SpreadOf(gbps);
}

Child::Child(const std::vector<std::string>& args) {
  int in[2], out[2];
  if (pipe(in) != 0 || pipe(out) != 0) {
    std::perror("pipe");
    std::exit(1);
  }
  pid_ = fork();
  if (pid_ == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    close(in[0]), close(in[1]), close(out[0]), close(out[1]);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  to_ = fdopen(in[1], "w");
  from_ = fdopen(out[0], "r");
}

Child::~Child() {
  if (to_) fclose(to_);
  if (from_) fclose(from_);
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
  }
}

std::string Python() {
  const char* p = std::getenv("PYTHON");
  return p ? p : "python3";
}

// NCCL pack + send/recv + unpack GB/s per block KiB, from tests/gpu/nccl_baseline.py.
std::map<uint64_t, double> NcclBaseline(uint64_t total, int reps) {
  std::map<uint64_t, double> out;
  Child c({"timeout", "180", Python(), "tests/gpu/nccl_baseline.py", "--total-bytes",
           std::to_string(total), "--reps", std::to_string(reps)});
  for (std::string l = c.Line(); !l.empty(); l = c.Line()) {
    unsigned long kib = 0;
    double g = 0;
    if (std::sscanf(l.c_str(), "nccl %lu %lf", &kib, &g) == 2) out[kib] = g;
  }
  return out;
}

// Transfers every destination block's bytes back and checks them against the source's: the
// benchmark's transfers moved the right blocks (a bench that times a wrong copy is worthless).
void VerifyBlocks(const Pools& p) {
  std::vector<uint8_t> a(p.block_bytes), b(p.block_bytes);
  for (uint32_t i = 0; i < p.moved; i += std::max<uint32_t>(1, p.moved / 512)) {
    Check(cudaMemcpy(a.data(), p.src->data() + uint64_t{p.src_blocks[i]} * p.block_bytes,
                     p.block_bytes, cudaMemcpyDefault),
          "verify src");
    const uint8_t* d = p.dst ? p.dst->data() : p.host_dst->data();
    Check(cudaMemcpy(b.data(), d + uint64_t{p.dst_blocks[i]} * p.block_bytes, p.block_bytes,
                     cudaMemcpyDefault),
          "verify dst");
    if (a != b) {
      std::fprintf(stderr, "block %u arrived wrong\n", i);
      std::exit(1);
    }
  }
}

// Fills the whole source pool with words that differ everywhere (a misplaced or unwritten block
// shows) and zeroes the destination.
void Pattern(const Pools& p) {
  const uint64_t bytes = uint64_t{p.pool_blocks} * p.block_bytes;
  std::vector<uint32_t> words((64ull << 20) / 4);
  for (uint64_t at = 0; at < bytes; at += words.size() * 4) {
    const uint64_t n = std::min<uint64_t>(words.size() * 4, bytes - at);
    for (uint64_t w = 0; w < n / 4; ++w)
      words[w] = static_cast<uint32_t>((at / 4 + w + 1) * 2654435761u);
    Check(cudaMemcpy(p.src->data() + at, words.data(), n, cudaMemcpyHostToDevice), "pattern");
  }
  if (p.dst && !p.dst->Fill(0).ok()) std::exit(1);
  Check(cudaDeviceSynchronize(), "sync");
  Check(cudaSetDevice(g_src), "cudaSetDevice(--src-gpu)");
}

}  // namespace kvrail::engine_bench
