// kv_demo: a prefill process hands a Llama-3-8B-shaped paged KV cache to a decode process through
// kvraild, and the decode side checks every byte.
//
//   kv_demo prefill --socket S --info FILE --seed N   # fills + registers its pool, writes FILE,
//                                                     # then holds the region until stdin EOF or
//                                                     # SIGTERM/SIGINT
//   kv_demo decode  --socket S --info FILE            # waits for FILE, moves the prompt's KV into
//                                                     # its own pool, verifies, prints one line
//
// Shape: 32 layers, K and V, 8 KV heads of 128 bf16 elements, 16-token blocks, NHD order
// (LAYOUT_ORDER_LAYER_PART_BLOCK_NHD), a 4096-token prompt (256 blocks) in pools of 1024 blocks.
// Prefill writes f(seed, layer, part, token position, head, element) into every byte of the
// blocks it uses, so decode recomputes the expected bytes without reading prefill's memory.
// Exit codes: 0 success, 1 failure (including a mismatch), 2 usage.
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/status.h"
#include "client/cuda_export.h"
#include "client/kvrail_client.h"

namespace kvrail::client::demo {
namespace {

constexpr uint8_t kPoison = 0xAB;
// Decode's block permutation differs from prefill's even for the same --seed.
constexpr uint64_t kDecodePermutationSalt = 0xDEC0DE5EEDull;

struct Shape {
  uint32_t layers = 32, parts = 2, heads = 8, head_dim = 128, tokens_per_block = 16;
  uint32_t pool_blocks = 1024;
  uint32_t tokens = 4096;
  uint32_t prompt_blocks() const { return (tokens + tokens_per_block - 1) / tokens_per_block; }
  uint32_t vector_bytes() const { return head_dim * 2; }  // bf16
};

v1::PagedKvLayout MakeLayout(const Shape& s) {
  v1::PagedKvLayout l;
  l.set_num_layers(s.layers);
  l.set_num_parts(s.parts);
  l.set_num_blocks(s.pool_blocks);
  l.set_tokens_per_block(s.tokens_per_block);
  l.set_num_heads(s.heads);
  l.set_head_dim(s.head_dim);
  l.set_dtype(v1::DTYPE_BF16);
  l.set_order(v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  return l;
}

uint64_t Mix(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

// f(seed, layer, part, position, head, element): the bytes of one head vector. Each byte depends
// on all six coordinates (the element is the byte's place in the vector's stream).
void PatternVector(uint8_t* out, uint32_t bytes, uint64_t seed, uint32_t layer, uint32_t part,
                   uint32_t position, uint32_t head) {
  uint64_t state = Mix(seed ^ Mix((uint64_t{layer} << 40) ^ (uint64_t{part} << 32) ^
                                  (uint64_t{head} << 48) ^ position));
  for (uint32_t i = 0; i < bytes; i += 8) {
    state += 0x9E3779B97F4A7C15ull;
    const uint64_t v = Mix(state);
    std::memcpy(out + i, &v, std::min<uint32_t>(8, bytes - i));
  }
}

std::vector<uint32_t> ScatteredBlocks(uint32_t pool_blocks, uint32_t count, uint64_t seed) {
  std::vector<uint32_t> ids(pool_blocks);
  std::iota(ids.begin(), ids.end(), 0u);
  std::mt19937_64 rng(seed);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(count);
  return ids;
}

// Runs fn(layer) for every layer on all cores.
template <typename Fn>
void ForEachLayer(uint32_t layers, Fn fn) {
  const uint32_t workers = std::max(1u, std::min(layers, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      for (uint32_t l = w; l < layers; l += workers) fn(l);
    });
  }
  for (auto& t : threads) t.join();
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.flush();
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("rename ", tmp, " -> ", path, ": ", strerror(err)));
  }
  return absl::OkStatus();
}

// --gpu: -1 host memory, >= 0 that GPU, kAutoGpu: GPUs when the machine has them (prefill on
// GPU0; decode on GPU1 when there are two, else GPU0).
constexpr int kAutoGpu = -2;

int ResolveGpu(int gpu, bool decode) {
  if (gpu != kAutoGpu) return gpu;
  const int n = CudaDeviceCount();
  if (n == 0) return -1;
  return decode && n > 1 ? 1 : 0;
}

// One side's pool: host memory shared over a memfd, or GPU memory exported over CUDA IPC with a
// host mirror that is filled (prefill) or verified (decode) and copied to/from the GPU.
struct DemoPool {
  std::unique_ptr<HostBuffer> host;
  std::unique_ptr<CudaBuffer> gpu;
  std::vector<uint8_t> mirror;
  uint8_t* data() { return host ? host->data() : mirror.data(); }
};

absl::StatusOr<DemoPool> MakeDemoPool(Client& client, uint64_t bytes, int gpu) {
  DemoPool pool;
  if (gpu < 0) {
    KVRAIL_ASSIGN_OR_RETURN(pool.host, client.CreateHostBuffer(bytes));
  } else {
    KVRAIL_ASSIGN_OR_RETURN(pool.gpu, CudaBuffer::Create(gpu, bytes));
    pool.mirror.assign(bytes, 0);
  }
  return pool;
}

// GPU pools: the mirror goes to the GPU first.
absl::StatusOr<v1::RegionInfo> RegisterDemoPool(Client& client, DemoPool& pool,
                                                v1::RegionSpec spec) {
  if (pool.host) return client.RegisterHostBuffer(*pool.host, std::move(spec));
  KVRAIL_RETURN_IF_ERROR(pool.gpu->CopyFromHost(0, pool.mirror.data(), pool.mirror.size()));
  return RegisterCudaRegion(client, pool.gpu->data(), pool.gpu->size(), std::move(spec));
}

absl::Status SyncFromGpu(DemoPool& pool) {
  if (!pool.gpu) return absl::OkStatus();
  return pool.gpu->CopyToHost(0, pool.mirror.data(), pool.mirror.size());
}

std::string Where(int gpu) { return gpu < 0 ? "host memory" : absl::StrCat("GPU", gpu); }

int Fail(absl::string_view role, const absl::Status& status) {
  std::cerr << "kv_demo " << role << ": " << status << "\n";
  return 1;
}

sigset_t TerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

// Blocks until stdin reaches EOF (unless ignore_stdin) or SIGTERM/SIGINT arrives. The signals
// must have been blocked before any thread started (see Main), so that none of gRPC's threads
// takes them with the default action (death, exit code 143).
void WaitForEofOrSignal(bool ignore_stdin) {
  const sigset_t set = TerminationSignals();
  const int sfd = ::signalfd(-1, &set, SFD_CLOEXEC);
  struct pollfd fds[2] = {{sfd, POLLIN, 0}, {ignore_stdin ? -1 : STDIN_FILENO, POLLIN, 0}};
  char buffer[4096];
  while (true) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[0].revents != 0) break;  // a signal
    if (fds[1].revents != 0) {
      const ssize_t n = ::read(STDIN_FILENO, buffer, sizeof(buffer));
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) break;  // EOF
    }
  }
  if (sfd >= 0) ::close(sfd);
}

int Prefill(const std::string& socket, const std::string& info_path, uint64_t seed,
            const Shape& shape, bool ignore_stdin, bool writable, int gpu) {
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(socket);
  if (!client.ok()) return Fail("prefill", client.status());
  const v1::PagedKvLayout layout = MakeLayout(shape);
  absl::StatusOr<PagedStrides> strides = ResolveStrides(layout);
  absl::StatusOr<uint64_t> bytes = PagedLayoutBytes(layout);
  if (!strides.ok() || !bytes.ok()) return Fail("prefill", strides.status());
  absl::StatusOr<DemoPool> pool = MakeDemoPool(**client, *bytes, gpu);
  if (!pool.ok()) return Fail("prefill", pool.status());

  const std::vector<uint32_t> blocks =
      ScatteredBlocks(shape.pool_blocks, shape.prompt_blocks(), seed);
  uint8_t* base = pool->data();
  ForEachLayer(shape.layers, [&](uint32_t l) {
    for (uint32_t p = 0; p < shape.parts; ++p) {
      for (uint32_t i = 0; i < blocks.size(); ++i) {
        for (uint32_t t = 0; t < shape.tokens_per_block; ++t) {
          for (uint32_t h = 0; h < shape.heads; ++h) {
            PatternVector(base + PagedOffset(layout, *strides, l, p, blocks[i], t, h),
                          shape.vector_bytes(), seed, l, p, i * shape.tokens_per_block + t, h);
          }
        }
      }
    }
  });

  v1::RegionSpec spec;
  spec.set_name("kv_demo-prefill");
  *spec.mutable_paged_kv() = layout;
  spec.set_writable(writable);
  absl::StatusOr<v1::RegionInfo> region = RegisterDemoPool(**client, *pool, spec);
  if (!region.ok()) return Fail("prefill", region.status());
  // The decode process may read this pool: a grant travels with the info, as a router would
  // pass it with the request (without it the daemon refuses another session's read).
  absl::StatusOr<v1::Grant> grant =
      (*client)->CreateGrant(region->region_id(), v1::GRANT_ACCESS_READ, absl::Minutes(10));
  if (!grant.ok()) return Fail("prefill", grant.status());

  nlohmann::json info = {
      {"region_id", region->region_id()},
      {"grant", grant->token()},
      {"session_id", region->session_id()},
      {"block_ids", blocks},
      {"seed", seed},
      {"num_tokens", shape.tokens},
      {"num_layers", shape.layers},
      {"num_parts", shape.parts},
      {"num_blocks", shape.pool_blocks},
      {"tokens_per_block", shape.tokens_per_block},
      {"num_heads", shape.heads},
      {"head_dim", shape.head_dim},
      {"dtype", "bf16"},
      {"order", "LAYER_PART_BLOCK_NHD"},
      {"pid", ::getpid()},
  };
  if (absl::Status s = WriteFileAtomically(info_path, info.dump(1)); !s.ok()) {
    return Fail("prefill", s);
  }
  std::cout << "kv_demo prefill: region " << region->region_id() << " (session "
            << region->session_id() << "), " << blocks.size() << " blocks, "
            << absl::StrFormat("%.1f MiB", static_cast<double>(*bytes) / (1 << 20)) << " pool in "
            << Where(gpu) << "; info in " << info_path << "; holding until "
            << (ignore_stdin ? "SIGTERM" : "stdin EOF or SIGTERM") << std::endl;
  WaitForEofOrSignal(ignore_stdin);
  std::cout << "kv_demo prefill: done" << std::endl;
  return 0;  // the Client's destructor closes the session; the daemon releases the region
}

absl::StatusOr<nlohmann::json> WaitForInfo(const std::string& path, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    std::ifstream in(path);
    if (in) {
      std::stringstream text;
      text << in.rdbuf();
      nlohmann::json info = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
      if (info.is_discarded()) return absl::DataLossError(absl::StrCat(path, ": not valid JSON"));
      return info;
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("no info file ", path, " after ",
                                                      absl::FormatDuration(timeout),
                                                      " (is kv_demo prefill running?)"));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

struct Mismatch {
  uint32_t layer, part, token, head, byte;
  uint32_t unused_block;  // != UINT32_MAX: the poison of this unused block was overwritten
  uint32_t slot;          // token slot in the block (for unused blocks)
};

int Decode(const std::string& socket, const std::string& info_path, uint32_t pool_blocks,
           uint64_t timeout_ms, int gpu) {
  absl::StatusOr<nlohmann::json> info =
      WaitForInfo(info_path, absl::Milliseconds(timeout_ms == 0 ? 60000 : timeout_ms));
  if (!info.ok()) return Fail("decode", info.status());
  Shape shape;
  uint64_t seed = 0, src_region = 0;
  std::string src_grant;
  std::vector<uint32_t> src_blocks;
  try {
    const nlohmann::json& j = *info;
    shape.layers = j.at("num_layers");
    shape.parts = j.at("num_parts");
    shape.heads = j.at("num_heads");
    shape.head_dim = j.at("head_dim");
    shape.tokens_per_block = j.at("tokens_per_block");
    shape.tokens = j.at("num_tokens");
    seed = j.at("seed");
    src_region = j.at("region_id");
    src_grant = j.at("grant").get<std::string>();
    src_blocks = j.at("block_ids").get<std::vector<uint32_t>>();
    if (j.at("dtype") != "bf16" || j.at("order") != "LAYER_PART_BLOCK_NHD") {
      return Fail("decode", absl::InvalidArgumentError("info: only bf16 NHD is supported"));
    }
  } catch (const nlohmann::json::exception& e) {
    return Fail("decode", absl::InvalidArgumentError(absl::StrCat(info_path, ": ", e.what())));
  }
  shape.pool_blocks = pool_blocks;
  if (shape.prompt_blocks() > shape.pool_blocks || src_blocks.size() != shape.prompt_blocks()) {
    return Fail("decode", absl::InvalidArgumentError(absl::StrCat(
                              "prompt needs ", shape.prompt_blocks(), " blocks; info lists ",
                              src_blocks.size(), ", pool holds ", shape.pool_blocks)));
  }

  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(socket);
  if (!client.ok()) return Fail("decode", client.status());
  const v1::PagedKvLayout layout = MakeLayout(shape);
  absl::StatusOr<PagedStrides> strides = ResolveStrides(layout);
  absl::StatusOr<uint64_t> bytes = PagedLayoutBytes(layout);
  if (!strides.ok() || !bytes.ok()) return Fail("decode", strides.status());
  absl::StatusOr<DemoPool> pool = MakeDemoPool(**client, *bytes, gpu);
  if (!pool.ok()) return Fail("decode", pool.status());
  uint8_t* base = pool->data();
  std::memset(base, kPoison, *bytes);

  v1::RegionSpec spec;
  spec.set_name("kv_demo-decode");
  *spec.mutable_paged_kv() = layout;
  spec.set_writable(true);
  absl::StatusOr<v1::RegionInfo> region = RegisterDemoPool(**client, *pool, spec);
  if (!region.ok()) return Fail("decode", region.status());

  const std::vector<uint32_t> dst_blocks =
      ScatteredBlocks(shape.pool_blocks, shape.prompt_blocks(), seed ^ kDecodePermutationSalt);
  v1::TransferSpec transfer =
      MakeBlockTransfer(src_region, src_blocks, region->region_id(), dst_blocks);
  transfer.mutable_src()->set_grant(src_grant);
  transfer.set_num_tokens(shape.tokens);
  transfer.set_priority(v1::PRIORITY_CRITICAL);
  transfer.set_timeout_ms(timeout_ms);
  transfer.set_label("kv_demo");

  const absl::Time t0 = absl::Now();
  absl::StatusOr<v1::SubmitTransferResponse> submitted = (*client)->Submit(transfer);
  if (!submitted.ok()) return Fail("decode", submitted.status());
  absl::StatusOr<v1::TransferStatus> final_status =
      (*client)->Watch(submitted->transfer_id(), [](const v1::TransferEvent&) { return true; });
  if (!final_status.ok() && final_status.status().code() == absl::StatusCode::kUnimplemented) {
    final_status = (*client)->Wait(submitted->transfer_id());
  }
  const absl::Time t1 = absl::Now();
  if (!final_status.ok()) return Fail("decode", final_status.status());
  if (final_status->state() != v1::TRANSFER_STATE_SUCCEEDED) {
    std::cout << "kv_demo decode: transfer " << submitted->transfer_id() << " ended "
              << v1::TransferState_Name(final_status->state()) << ": "
              << final_status->error_message() << std::endl;
    return 1;
  }
  if (absl::Status s = SyncFromGpu(*pool); !s.ok()) return Fail("decode", s);  // GPU pool -> mirror

  // Verify: used blocks hold f(...) for every token of the prompt (and poison past its end);
  // every other block is still poison.
  std::vector<int32_t> slot_of(shape.pool_blocks, -1);
  for (uint32_t i = 0; i < dst_blocks.size(); ++i) slot_of[dst_blocks[i]] = static_cast<int32_t>(i);
  const uint64_t block_bytes =
      uint64_t{shape.tokens_per_block} * shape.heads * shape.vector_bytes();
  const std::vector<uint8_t> poison(std::max<uint64_t>(block_bytes, shape.vector_bytes()), kPoison);
  // Used blocks in token order first, so the first mismatch reported is the earliest token.
  std::vector<uint32_t> visit = dst_blocks;
  for (uint32_t b = 0; b < shape.pool_blocks; ++b) {
    if (slot_of[b] < 0) visit.push_back(b);
  }
  std::vector<std::optional<Mismatch>> first(shape.layers);
  ForEachLayer(shape.layers, [&](uint32_t l) {
    std::vector<uint8_t> expected(shape.vector_bytes());
    for (uint32_t p = 0; p < shape.parts && !first[l]; ++p) {
      for (size_t v = 0; v < visit.size() && !first[l]; ++v) {
        const uint32_t b = visit[v];
        const int32_t slot = slot_of[b];
        for (uint32_t t = 0; t < shape.tokens_per_block && !first[l]; ++t) {
          const uint32_t pos = slot < 0 ? 0 : slot * shape.tokens_per_block + t;
          for (uint32_t h = 0; h < shape.heads && !first[l]; ++h) {
            const uint8_t* got = base + PagedOffset(layout, *strides, l, p, b, t, h);
            const uint8_t* want = poison.data();
            if (slot >= 0 && pos < shape.tokens) {
              PatternVector(expected.data(), shape.vector_bytes(), seed, l, p, pos, h);
              want = expected.data();
            }
            if (std::memcmp(got, want, shape.vector_bytes()) == 0) continue;
            uint32_t byte = 0;
            while (got[byte] == want[byte]) ++byte;
            first[l] = Mismatch{l, p, pos, h, byte, slot >= 0 ? UINT32_MAX : b, t};
          }
        }
      }
    }
  });
  const double seconds = absl::ToDoubleSeconds(t1 - t0);
  const uint64_t moved = final_status->bytes_done();
  std::string summary = absl::StrFormat(
      "kv_demo decode: transfer %d, %d bytes (%.1f MiB) in %.3f ms = %.2f GB/s, path %s, "
      "engine %s: ",
      submitted->transfer_id(), moved, static_cast<double>(moved) / (1 << 20), seconds * 1e3,
      seconds > 0 ? static_cast<double>(moved) / seconds / 1e9 : 0.0,
      absl::StrCat(v1::Path_Name(final_status->path()), " (", final_status->path_reason(), ")"),
      final_status->engine().empty() ? "-" : final_status->engine());
  for (uint32_t l = 0; l < shape.layers; ++l) {
    if (!first[l]) continue;
    const Mismatch& m = *first[l];
    if (m.unused_block != UINT32_MAX) {
      std::cout << summary
                << absl::StrFormat(
                       "MISMATCH at layer %d part %d unused block %d slot %d head %d byte %d "
                       "(poison 0xAB overwritten)",
                       m.layer, m.part, m.unused_block, m.slot, m.head, m.byte)
                << std::endl;
    } else {
      std::cout << summary
                << absl::StrFormat("MISMATCH at layer %d part %d token %d head %d byte %d", m.layer,
                                   m.part, m.token, m.head, m.byte)
                << std::endl;
    }
    return 1;
  }
  std::cout << summary << "verified" << std::endl;
  return 0;
}

int Main(int argc, char** argv) {
  CLI::App app{"kv_demo: prefill -> decode KV cache hand-off through kvraild"};
  app.require_subcommand(1);
  std::string socket = DefaultTarget();
  std::string info_path;
  uint64_t seed = 1;
  uint64_t timeout_ms = 60000;
  bool ignore_stdin = false;
  bool writable = false;
  int gpu = kAutoGpu;
  Shape shape;
  CLI::App* prefill = app.add_subcommand("prefill", "fill, register and hold a KV pool");
  CLI::App* decode = app.add_subcommand("decode", "pull the prompt's KV and verify it");
  for (CLI::App* sub : {prefill, decode}) {
    sub->add_option("--socket", socket, "kvraild's unix socket")->capture_default_str();
    sub->add_option("--info", info_path, "the JSON info file prefill writes")->required();
    sub->add_option("--pool-blocks", shape.pool_blocks, "blocks in this side's pool")
        ->capture_default_str();
    sub->add_option("--gpu", gpu,
                    "pool in this GPU's memory (exported over CUDA IPC); -1: host memory; "
                    "default: GPUs when present (prefill GPU0, decode GPU1 if there are two)");
  }
  prefill->add_option("--seed", seed, "pattern and block-permutation seed")->capture_default_str();
  prefill->add_option("--tokens", shape.tokens, "prompt length in tokens")->capture_default_str();
  prefill->add_flag("--ignore-stdin", ignore_stdin,
                    "hold the region until SIGTERM only (for background runs with stdin at EOF)");
  prefill->add_flag("--writable", writable,
                    "register the pool writable (so it can also be a destination, e.g. for "
                    "`kvrail submit` experiments)");
  decode
      ->add_option("--timeout-ms", timeout_ms,
                   "wait for the info file, and the transfer's deadline (0: 60 s / none)")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (prefill->parsed()) {
    if (shape.tokens == 0 || shape.prompt_blocks() > shape.pool_blocks) {
      std::cerr << "kv_demo prefill: --tokens must be > 0 and fit in --pool-blocks\n";
      return 2;
    }
    // Before any thread exists: threads inherit the mask, so SIGTERM reaches only the signalfd.
    const sigset_t signals = TerminationSignals();
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    return Prefill(socket, info_path, seed, shape, ignore_stdin, writable, ResolveGpu(gpu, false));
  }
  return Decode(socket, info_path, shape.pool_blocks, timeout_ms, ResolveGpu(gpu, true));
}

}  // namespace
}  // namespace kvrail::client::demo

int main(int argc, char** argv) { return kvrail::client::demo::Main(argc, argv); }
