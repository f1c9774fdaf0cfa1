// The first transfer: where a client's first Submit of a large block table spends its time, on
// the host alone (host regions, host engine; no GPU). Prints the phases of the first and later
// Submits of 32768 + 32768 ids (client call -> daemon received / accept / reply -> client /
// queued), then what a fresh client's CreateHostBuffer(1 MiB) + RegisterHostBuffer cost (what the
// client library would do on its first such Submit; it does it in Connect),
// and whether Connect registered the table region.
// Usage: first_submit_probe   (starts its own kvraild from runfiles or ./daemon/kvraild)
//        KVRAIL_BLOCK_TABLE_BUFFER=lazy first_submit_probe   (the region made on first use, as
//        before)
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "absl/time/clock.h"
#include "client/kvrail_client.h"
#include "tests/harness/daemon_process.h"

namespace kvrail {
namespace {

double UnixUs() { return absl::ToDoubleMicroseconds(absl::Now() - absl::UnixEpoch()); }

int Main() {
  testing::TempDir dir;
  testing::DaemonProcess daemon;
  daemon.set_log_level("info");  // a benchmark: no per-transfer debug lines
  if (!daemon.Start(dir.path())) return 1;
  auto cl = client::Client::Connect(daemon.socket());
  if (!cl.ok()) return 1;
  const uint32_t pool = 65536, n = 32768;
  v1::PagedKvLayout l = testing::MakeLayout(1, 1, pool, 16, 1, 128, v1::DTYPE_BF16,
                                            v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  const uint64_t bytes = testing::LayoutBytes(l);
  std::vector<std::unique_ptr<client::HostBuffer>> buffers;
  std::vector<uint64_t> ids;
  for (bool writable : {false, true}) {
    auto b = (*cl)->CreateHostBuffer(bytes);
    if (!b.ok()) return 1;
    v1::RegionSpec spec;
    spec.set_memory_kind(v1::MEMORY_KIND_HOST);
    spec.set_size_bytes(bytes);
    spec.set_writable(writable);
    *spec.mutable_paged_kv() = l;
    auto info = (*cl)->RegisterHostBuffer(**b, spec);
    if (!info.ok()) return 1;
    ids.push_back(info->region_id());
    buffers.push_back(*std::move(b));
  }
  std::mt19937_64 rng(1);
  std::printf(
      "| submit | client -> received | accept | reply | queued | wall ms "
      "|\n|---|---|---|---|---|---|\n");
  for (int i = 0; i < 6; ++i) {
    std::vector<uint32_t> s(pool), d(pool);
    std::iota(s.begin(), s.end(), 0u);
    std::iota(d.begin(), d.end(), 0u);
    std::shuffle(s.begin(), s.end(), rng);
    std::shuffle(d.begin(), d.end(), rng);
    s.resize(n);
    d.resize(n);
    v1::TransferSpec spec = client::MakeBlockTransfer(ids[0], s, ids[1], d);
    const auto t0 = std::chrono::steady_clock::now();
    const double u0 = UnixUs();
    auto sub = (*cl)->Submit(spec);
    const double u1 = UnixUs();
    if (!sub.ok()) return 1;
    auto st = (*cl)->Wait(sub->transfer_id());
    if (!st.ok() || st->state() != v1::TRANSFER_STATE_SUCCEEDED) return 1;
    std::printf(
        "| %d | %.0f | %lld | %.0f | %lld | %.1f |\n", i, st->received_unix_us() - u0,
        static_cast<long long>(st->submitted_unix_us() - st->received_unix_us()),
        u1 - st->submitted_unix_us(),
        static_cast<long long>(st->started_unix_us() - st->submitted_unix_us()),
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  for (int i = 0; i < 3; ++i) {
    const double c0 = UnixUs();
    auto fresh = client::Client::Connect(daemon.socket());
    const double c1 = UnixUs();
    if (!fresh.ok()) return 1;
    auto listed = (*fresh)->ListRegions(/*include_library_regions=*/true);
    int tables = 0;
    if (!listed.ok()) return 1;
    for (const auto& r : listed->regions()) {
      tables += r.spec().library_region() && r.session_id() == *(*fresh)->SessionId();
    }
    std::printf("fresh client %d: Connect %.0f us, its block-table region %s\n", i, c1 - c0,
                tables == 1 ? "registered by Connect" : "not registered yet");
    auto warm = (*fresh)->ListRegions();  // the session and channel up, as after registrations
    const double u0 = UnixUs();
    auto b = (*fresh)->CreateHostBuffer(1 << 20);
    const double u1 = UnixUs();
    v1::RegionSpec spec;
    spec.set_name("probe host buffer");  // an ordinary region of the table region's size
    auto info = (*fresh)->RegisterHostBuffer(**b, spec);
    const double u2 = UnixUs();
    std::printf(
        "fresh client %d: CreateHostBuffer(1 MiB) %.0f us, RegisterHostBuffer %.0f us (%s)\n", i,
        u1 - u0, u2 - u1, info.ok() ? "ok" : info.status().ToString().c_str());
  }
  return 0;
}

}  // namespace
}  // namespace kvrail

int main() { return kvrail::Main(); }
