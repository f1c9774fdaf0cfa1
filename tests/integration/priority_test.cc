// Priority classes on the host engine: a critical transfer overtakes queued background tiles
// (preemption at tile granularity), and background work never takes the last free worker.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "tests/integration/kv_fixture.h"

namespace kvrail::testing {
namespace {

using client::Client;

TEST_CASE("a critical transfer overtakes a large background transfer already running") {
  LiveDaemon live({"--host-threads", "2", "--tile-bytes", "65536"});
  // 256 MiB of background traffic in 64 KiB tiles (4096 tiles).
  const auto big =
      MakeLayout(32, 2, 256, 16, 8, 128, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  Pool bg_src = MakePool(*live.client, big, false, "bg-src");
  Pool bg_dst = MakePool(*live.client, big, true, "bg-dst");
  const auto small =
      MakeLayout(4, 2, 16, 16, 8, 128, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  Pool crit_src = MakePool(*live.client, small, false, "crit-src");
  Pool crit_dst = MakePool(*live.client, small, true, "crit-dst");
  const auto crit_blocks = ScatteredBlocks(16, 8, 1);
  FillPool(crit_src, 3, crit_blocks, 8 * 16);

  std::vector<uint32_t> all(256);
  for (uint32_t i = 0; i < 256; ++i) all[i] = i;
  auto bg_spec = client::MakeBlockTransfer(bg_src.id(), all, bg_dst.id(), all);
  bg_spec.set_priority(v1::PRIORITY_BACKGROUND);
  auto bg = live.client->Submit(bg_spec);
  REQUIRE(bg.ok());
  // Let the background transfer get going, then submit the critical one.
  for (int i = 0; i < 1000; ++i) {
    auto s = live.client->Get(bg->transfer_id());
    REQUIRE(s.ok());
    if (s->state() == v1::TRANSFER_STATE_RUNNING) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  auto crit_spec = client::MakeBlockTransfer(crit_src.id(), crit_blocks, crit_dst.id(),
                                             ScatteredBlocks(16, 8, 2));
  crit_spec.set_priority(v1::PRIORITY_CRITICAL);
  auto crit = live.client->Submit(crit_spec);
  REQUIRE(crit.ok());
  auto crit_done = live.client->Wait(crit->transfer_id(), absl::Seconds(30));
  REQUIRE(crit_done.ok());
  REQUIRE(crit_done->state() == v1::TRANSFER_STATE_SUCCEEDED);
  // When the critical transfer ended, the background one was still moving.
  auto bg_now = live.client->Get(bg->transfer_id());
  REQUIRE(bg_now.ok());
  CHECK(bg_now->state() == v1::TRANSFER_STATE_RUNNING);
  CHECK(bg_now->bytes_done() < bg_now->bytes_total());
  auto bg_done = live.client->Wait(bg->transfer_id(), absl::Seconds(60));
  REQUIRE(bg_done.ok());
  CHECK(bg_done->state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(bg_done->finished_unix_us() > crit_done->finished_unix_us());
  CHECK(VerifyPool(crit_dst, Expectation{3, ScatteredBlocks(16, 8, 2), 8 * 16, 0, 0, 4, 0, 0, 8}) ==
        "");
  // The engine line says how background work is limited.
  auto stats = live.client->GetStats();
  REQUIRE(stats.ok());
  CHECK(stats->engines(0).find("background at most 1") != std::string::npos);
}

TEST_CASE("cancelling a queued background transfer frees its queue at once") {
  LiveDaemon live({"--host-threads", "1", "--tile-bytes", "65536"});
  const auto big =
      MakeLayout(32, 2, 256, 16, 8, 128, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  Pool src = MakePool(*live.client, big, false);
  Pool dst = MakePool(*live.client, big, true);
  std::vector<uint32_t> all(256);
  for (uint32_t i = 0; i < 256; ++i) all[i] = i;
  auto spec = client::MakeBlockTransfer(src.id(), all, dst.id(), all);
  spec.set_priority(v1::PRIORITY_BACKGROUND);
  auto t = live.client->Submit(spec);
  REQUIRE(t.ok());
  auto cancelled = live.client->Cancel(t->transfer_id());
  REQUIRE(cancelled.ok());
  auto final_status = live.client->Wait(t->transfer_id(), absl::Seconds(10));
  REQUIRE(final_status.ok());
  // 256 MiB in 64 KiB tiles on one thread takes tens of milliseconds; the cancel arrives long
  // before the last tile.
  REQUIRE(final_status->state() == v1::TRANSFER_STATE_CANCELLED);
  CHECK(final_status->bytes_done() < final_status->bytes_total());
  auto stats = live.client->GetStats();
  REQUIRE(stats.ok());
  CHECK(stats->queued_tiles().at("background") == 0);
}

}  // namespace
}  // namespace kvrail::testing

namespace kvrail::testing {
namespace {

TEST_CASE("a deadline that cannot be met fails at submit, before anything moves") {
  LiveDaemon live({"--host-threads", "1", "--tile-bytes", "65536"});
  const auto big =
      MakeLayout(32, 2, 256, 16, 8, 128, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  Pool src = MakePool(*live.client, big, false);
  Pool dst = MakePool(*live.client, big, true);
  Pool other = MakePool(*live.client, big, true, "untouched");
  std::vector<uint32_t> all(256);
  for (uint32_t i = 0; i < 256; ++i) all[i] = i;
  // Before the engine has measured anything it cannot estimate: a tight deadline is accepted
  // (and then fails at the deadline, late but safe).
  auto warm = client::MakeBlockTransfer(src.id(), {0, 1, 2, 3}, dst.id(), {0, 1, 2, 3});
  auto w = live.client->Submit(warm);
  REQUIRE(w.ok());
  REQUIRE(live.client->Wait(w->transfer_id(), absl::Seconds(10))->state() ==
          v1::TRANSFER_STATE_SUCCEEDED);
  // Now it has a rate: 256 MiB in 1 ms on one host thread is impossible.
  auto spec = client::MakeBlockTransfer(src.id(), all, other.id(), all);
  spec.set_timeout_ms(1);
  auto refused = live.client->Submit(spec);
  INFO(refused.status().ToString());
  REQUIRE(!refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::string(refused.status().message()).find("spec.timeout_ms") != std::string::npos);
  CHECK(CountWritten(other) == 0);
  // A deadline it can meet is accepted and met.
  spec.set_timeout_ms(120000);
  auto ok = live.client->Submit(spec);
  REQUIRE(ok.ok());
  auto done = live.client->Wait(ok->transfer_id(), absl::Seconds(120));
  REQUIRE(done.ok());
  CHECK(done->state() == v1::TRANSFER_STATE_SUCCEEDED);
}

}  // namespace
}  // namespace kvrail::testing
