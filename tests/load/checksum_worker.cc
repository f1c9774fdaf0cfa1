#include "tests/load/checksum_worker.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/kvrail_client.h"
#include "tests/harness/proc_status.h"

namespace kvrail::testing {

using client::Client;

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
}

uint64_t VmRssKib(pid_t pid) { return ProcStatusField(pid, "VmRSS"); }

namespace {

constexpr uint8_t kPoison = 0xAB;
// Block-contiguous layout (layer, part, block, token, head): a whole block of one (layer, part)
// is one contiguous run of kBlockBytes, so the shadow is updated by block copies.
constexpr uint32_t kLayers = 4, kParts = 2, kBlocks = 64, kTpb = 16, kHeads = 2, kHeadDim = 64;
constexpr uint64_t kTokenBytes = uint64_t{kHeads} * kHeadDim * 2;  // bf16
constexpr uint64_t kBlockBytes = kTokenBytes * kTpb;
constexpr uint64_t kPoolBytes = kBlockBytes * kBlocks * kLayers * kParts;

uint64_t BlockOffset(uint32_t layer, uint32_t part, uint32_t block) {
  return ((uint64_t{layer} * kParts + part) * kBlocks + block) * kBlockBytes;
}

v1::PagedKvLayout Layout() {
  v1::PagedKvLayout l;
  l.set_num_layers(kLayers);
  l.set_num_parts(kParts);
  l.set_num_blocks(kBlocks);
  l.set_tokens_per_block(kTpb);
  l.set_num_heads(kHeads);
  l.set_head_dim(kHeadDim);
  l.set_dtype(v1::DTYPE_BF16);
  l.set_order(v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  return l;
}

struct Region {
  std::unique_ptr<client::HostBuffer> buffer;
  uint64_t id = 0;
};

absl::StatusOr<Region> Register(Client& c, bool writable, const std::string& name) {
  Region r;
  auto buffer = c.CreateHostBuffer(kPoolBytes);
  if (!buffer.ok()) return buffer.status();
  r.buffer = *std::move(buffer);
  std::memset(r.buffer->data(), kPoison, kPoolBytes);
  v1::RegionSpec spec;
  spec.set_name(name);
  spec.set_memory_kind(v1::MEMORY_KIND_HOST);
  spec.set_size_bytes(kPoolBytes);
  spec.set_writable(writable);
  *spec.mutable_paged_kv() = Layout();
  auto info = c.RegisterHostBuffer(*r.buffer, spec);
  if (!info.ok()) return info.status();
  r.id = info->region_id();
  return r;
}

// The region ids every client registered, so one can name another's (it must be refused).
std::mutex g_ids_mu;
std::vector<uint64_t> g_dst_ids;

class Worker final : public ChecksumWorker {
 public:
  Worker(const std::string& socket, uint32_t index)
      : socket_(socket), index_(index), rng_(1000 + index) {}

  bool Setup() override {
    auto c = Client::Connect(socket_);
    if (!c.ok()) return Fail(c.status().ToString());
    client_ = *std::move(c);
    auto src = Register(*client_, false, absl::StrCat("load-src-", index_));
    auto dst = Register(*client_, true, absl::StrCat("load-dst-", index_));
    if (!src.ok() || !dst.ok())
      return Fail("register: " + src.status().ToString() + dst.status().ToString());
    src_ = *std::move(src);
    dst_ = *std::move(dst);
    // A pattern unique to this client, block and byte.
    for (uint64_t i = 0; i < kPoolBytes; ++i) {
      src_.buffer->data()[i] = static_cast<uint8_t>((i * 2654435761u >> 7) + index_ * 37 + 1);
    }
    src_copy_.assign(src_.buffer->data(), src_.buffer->data() + kPoolBytes);
    shadow_.assign(kPoolBytes, kPoison);
    std::lock_guard<std::mutex> lock(g_ids_mu);
    g_dst_ids.push_back(dst_.id);
    return true;
  }

  void Run(uint64_t ops, std::atomic<uint64_t>* done_ops) override {
    for (uint64_t op = 0; op < ops && tally_.errors.size() < 5; ++op) {
      const uint32_t kind = Uniform(0, 99);
      if (kind < 60) {
        Good(/*cancel=*/false, /*deadline=*/false);
      } else if (kind < 72) {
        Good(/*cancel=*/true, false);
      } else if (kind < 80) {
        Good(false, /*deadline=*/true);
      } else {
        Invalid(kind % 6);
      }
      done_ops->fetch_add(1);
    }
  }

  void CheckSourceUntouched() override {
    if (std::memcmp(src_.buffer->data(), src_copy_.data(), kPoolBytes) != 0) {
      Fail("a read-only source pool changed");
    }
  }

  std::vector<absl::Duration> TakeLatencies() override { return std::exchange(latencies_, {}); }
  void Close() override { client_.reset(); }
  const Tally& tally() const override { return tally_; }

 private:
  uint32_t Uniform(uint32_t lo, uint32_t hi) {
    return std::uniform_int_distribution<uint32_t>(lo, hi)(rng_);
  }
  bool Fail(const std::string& what) {
    tally_.errors.push_back(absl::StrCat("client ", index_, ": ", what));
    std::fprintf(stderr, "%s\n", tally_.errors.back().c_str());
    return false;
  }

  // `n` distinct blocks in random order.
  std::vector<uint32_t> Blocks(uint32_t n) {
    std::vector<uint32_t> all(kBlocks);
    for (uint32_t i = 0; i < kBlocks; ++i) all[i] = i;
    std::shuffle(all.begin(), all.end(), rng_);
    all.resize(n);
    return all;
  }

  v1::TransferSpec Spec(const std::vector<uint32_t>& src_blocks,
                        const std::vector<uint32_t>& dst_blocks, uint64_t tokens) {
    v1::TransferSpec spec = client::MakeBlockTransfer(src_.id, src_blocks, dst_.id, dst_blocks);
    spec.set_num_tokens(tokens);
    return spec;
  }

  // Bytes of the block table position `j` that `tokens` tokens fill (the last may be partial).
  static uint64_t FilledBytes(size_t j, uint64_t tokens) {
    const uint64_t first = uint64_t{j} * kTpb;
    if (tokens <= first) return 0;
    return std::min<uint64_t>(tokens - first, kTpb) * kTokenBytes;
  }

  // A transfer that must succeed (or, cancelled or expired, stay within its blocks).
  void Good(bool cancel, bool deadline) {
    const uint32_t n = Uniform(1, cancel || deadline ? kBlocks : 16);
    const auto sb = Blocks(n), db = Blocks(n);
    const uint64_t tokens = uint64_t{n} * kTpb - Uniform(0, kTpb - 1);
    v1::TransferSpec spec = Spec(sb, db, tokens);
    if (deadline) spec.set_timeout_ms(Uniform(0, 2));
    const absl::Time began = absl::Now();
    auto submitted = client_->Submit(spec);
    if (!submitted.ok()) {
      if (deadline && submitted.status().code() == absl::StatusCode::kDeadlineExceeded) {
        ++tally_.expired;
        return Compare("an expired submit");
      }
      Fail("a valid transfer was refused: " + submitted.status().ToString());
      return;
    }
    if (cancel) {
      auto c = client_->Cancel(submitted->transfer_id());
      if (!c.ok() && c.status().code() != absl::StatusCode::kFailedPrecondition) {
        Fail("cancel: " + c.status().ToString());
      }
    }
    auto status = client_->Wait(submitted->transfer_id(), absl::Seconds(60));
    if (!status.ok()) {
      Fail("wait: " + status.status().ToString());
      return;
    }
    switch (status->state()) {
      case v1::TRANSFER_STATE_SUCCEEDED:
        ++tally_.succeeded;
        if (!cancel && !deadline) latencies_.push_back(absl::Now() - began);
        if (status->bytes_done() != status->bytes_total()) Fail("succeeded short");
        Apply(sb, db, tokens, /*exact=*/true);
        return Compare("a succeeded transfer");
      case v1::TRANSFER_STATE_CANCELLED:
      case v1::TRANSFER_STATE_FAILED:
        if (status->state() == v1::TRANSFER_STATE_CANCELLED && cancel) {
          ++tally_.cancelled;
        } else if (deadline &&
                   status->error_code() == static_cast<int>(absl::StatusCode::kDeadlineExceeded)) {
          ++tally_.expired;
        } else {
          Fail(absl::StrCat("a valid transfer ended ", v1::TransferState_Name(status->state()),
                            ": ", status->error_message()));
        }
        if (status->error_message().empty()) Fail("a transfer ended without a message");
        Apply(sb, db, tokens, /*exact=*/false);
        return Compare("a cancelled or expired transfer");
      default:
        Fail("wait returned a transfer that has not ended");
    }
  }

  // Updates the shadow for a transfer of `sb` -> `db`: exactly (succeeded), or, for one that may
  // have stopped part way, each destination byte it could have written must be the old or the
  // new value, and the shadow takes whatever is there.
  void Apply(const std::vector<uint32_t>& sb, const std::vector<uint32_t>& db, uint64_t tokens,
             bool exact) {
    const uint8_t* src = src_.buffer->data();
    const uint8_t* dst = dst_.buffer->data();
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (uint32_t p = 0; p < kParts; ++p) {
        for (size_t j = 0; j < sb.size(); ++j) {
          const uint64_t bytes = FilledBytes(j, tokens);
          const uint64_t so = BlockOffset(l, p, sb[j]), d = BlockOffset(l, p, db[j]);
          if (exact) {
            std::memcpy(&shadow_[d], src + so, bytes);
            continue;
          }
          for (uint64_t b = 0; b < bytes; ++b) {
            if (dst[d + b] != shadow_[d + b] && dst[d + b] != src[so + b]) {
              Fail(absl::StrCat(
                  "a stopped transfer wrote a byte that is neither old nor new (layer ", l,
                  " part ", p, " block ", db[j], " byte ", b, ")"));
              return;
            }
            shadow_[d + b] = dst[d + b];
          }
        }
      }
    }
  }

  // The whole destination pool against the shadow.
  void Compare(const char* after) {
    const uint8_t* dst = dst_.buffer->data();
    if (std::memcmp(dst, shadow_.data(), kPoolBytes) == 0) return;
    uint64_t i = 0;
    while (dst[i] == shadow_[i]) ++i;
    const uint64_t block = i / kBlockBytes;
    Fail(absl::StrCat("after ", after, ": destination byte ", i, " (layer ",
                      block / (kParts * kBlocks), " part ", block / kBlocks % kParts, " block ",
                      block % kBlocks, ") is ", int{dst[i]}, ", expected ", int{shadow_[i]}));
    shadow_.assign(dst, dst + kPoolBytes);  // report each corruption once
  }

  // A request that must be refused (at submit or as a failed transfer), writing nothing.
  void Invalid(uint32_t what) {
    const uint32_t n = Uniform(2, 8);
    auto sb = Blocks(n), db = Blocks(n);
    v1::TransferSpec spec = Spec(sb, db, uint64_t{n} * kTpb);
    std::string expect;
    switch (what) {
      case 0:
        spec.mutable_src()->set_block_ids(Uniform(0, n - 1), kBlocks + Uniform(0, 1000000));
        expect = "src.block";
        break;
      case 1:
        spec.mutable_dst()->set_block_ids(1, spec.dst().block_ids(0));
        expect = "dst.block";
        break;
      case 2:
        spec.mutable_dst()->set_region_id(dst_.id + 1000003);
        expect = "dst.region_id";
        break;
      case 3: {  // another client's destination, without its grant
        std::lock_guard<std::mutex> lock(g_ids_mu);
        uint64_t other = 0;
        for (uint64_t id : g_dst_ids) {
          if (id != dst_.id) other = id;
        }
        if (other == 0) return;
        spec.mutable_dst()->set_region_id(other);
        expect = "dst";
        break;
      }
      case 4:
        spec.mutable_dst()->set_region_id(src_.id);  // read-only
        expect = "dst";
        break;
      default:
        spec.set_num_layers(kLayers + 1);
        expect = "num_layers";
        break;
    }
    auto submitted = client_->Submit(spec);
    if (submitted.ok()) {
      auto status = client_->Wait(submitted->transfer_id(), absl::Seconds(60));
      if (!status.ok() || status->state() != v1::TRANSFER_STATE_FAILED) {
        Fail(absl::StrCat("an invalid request (", expect, ") was not refused"));
        return;
      }
      ++tally_.failed_other;
    } else {
      ++tally_.refused;
      const std::string message(submitted.status().message());
      if (message.find(expect) == std::string::npos) {
        Fail(absl::StrCat("refusal does not name ", expect, ": ", message));
      }
      if (submitted.status().code() == absl::StatusCode::kInternal ||
          submitted.status().code() == absl::StatusCode::kUnavailable) {
        Fail("refused with " + submitted.status().ToString());
      }
    }
    Compare("an invalid request");
  }

  const std::string socket_;
  const uint32_t index_;
  std::mt19937 rng_;
  std::unique_ptr<Client> client_;
  Region src_, dst_;
  std::vector<uint8_t> src_copy_, shadow_;
  Tally tally_;
  std::vector<absl::Duration> latencies_;
};

}  // namespace

std::unique_ptr<ChecksumWorker> ChecksumWorker::Create(const std::string& socket, uint32_t index) {
  return std::make_unique<Worker>(socket, index);
}

}  // namespace kvrail::testing
