// kvraild end to end through the client library: good transfers verified byte for byte, layout
// conversions, and bad requests rejected with the right code and a message naming the field while
// the daemon keeps serving and nothing is written.
#include <signal.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <mutex>
#include <thread>

#include "tests/integration/kv_fixture.h"

namespace kvrail::testing {
namespace {

using client::Client;

using Live = LiveDaemon;

TEST_CASE("a scattered paged KV cache moves between two regions, byte for byte") {
  Live live({"--tile-bytes", "65536"});
  const auto layout =
      MakeLayout(4, 2, 64, 16, 8, 128, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  Pool src = MakePool(*live.client, layout, false, "prefill");
  Pool dst = MakePool(*live.client, layout, true, "decode");
  const auto src_blocks = ScatteredBlocks(64, 20, 1);
  const auto dst_blocks = ScatteredBlocks(64, 20, 2);
  FillPool(src, 7, src_blocks, 20 * 16);
  auto spec = client::MakeBlockTransfer(src.id(), src_blocks, dst.id(), dst_blocks);
  const v1::TransferStatus status = RunToEnd(*live.client, spec);
  REQUIRE(status.state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(status.bytes_done() == status.bytes_total());
  CHECK(status.bytes_total() == uint64_t{4} * 2 * 20 * 16 * 8 * 128 * 2);
  CHECK(status.path() == v1::PATH_HOST_LOCAL);
  CHECK(status.engine() == "host");
  CHECK(status.link() == "host");
  CHECK(status.layers_done() == 4);
  Expectation e{7, dst_blocks, 20 * 16, 0, 0, 4, 0, 0, 8};
  CHECK(VerifyPool(dst, e) == "");
}

TEST_CASE("layout conversion: NHD to HND, 16 to 32 tokens per block, a head sub-range, layers") {
  Live live({"--tile-bytes", "16384"});
  // Prefill at TP 1 (8 heads, 16-token blocks, NHD); decode rank 1 of TP 2 (4 heads, 32-token
  // blocks, HND, layers stored at an offset).
  const auto src_layout =
      MakeLayout(6, 2, 40, 16, 8, 64, v1::DTYPE_FP16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  const auto dst_layout =
      MakeLayout(8, 2, 30, 32, 4, 64, v1::DTYPE_FP16, v1::LAYOUT_ORDER_BLOCK_LAYER_PART_HND);
  Pool src = MakePool(*live.client, src_layout, false);
  Pool dst = MakePool(*live.client, dst_layout, true);
  const uint64_t tokens = 16 * 10 - 5;  // a partial last block
  const auto src_blocks = ScatteredBlocks(40, 10, 3);
  const auto dst_blocks = ScatteredBlocks(30, 5, 4);
  FillPool(src, 9, src_blocks, 16 * 10);
  auto spec = client::MakeBlockTransfer(src.id(), src_blocks, dst.id(), dst_blocks);
  spec.set_num_tokens(tokens);
  spec.set_num_layers(4);
  spec.mutable_src()->set_layer_begin(1);
  spec.mutable_dst()->set_layer_begin(3);
  spec.set_num_heads(4);
  spec.mutable_src()->set_head_begin(4);
  spec.mutable_dst()->set_head_begin(0);
  const v1::TransferStatus status = RunToEnd(*live.client, spec);
  INFO(status.error_message());
  REQUIRE(status.state() == v1::TRANSFER_STATE_SUCCEEDED);
  Expectation e{9, dst_blocks, tokens, 1, 3, 4, 4, 0, 4};
  CHECK(VerifyPool(dst, e) == "");
}

TEST_CASE("integrity digest (spec.digest): reported equal on both sides, absent when off") {
  Live live({"--tile-bytes", "16384"});
  const auto src_layout =
      MakeLayout(4, 2, 40, 16, 8, 64, v1::DTYPE_FP16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  const auto dst_layout =
      MakeLayout(4, 2, 30, 32, 8, 64, v1::DTYPE_FP16, v1::LAYOUT_ORDER_BLOCK_LAYER_PART_HND);
  Pool src = MakePool(*live.client, src_layout, false);
  Pool dst = MakePool(*live.client, dst_layout, true);
  const auto src_blocks = ScatteredBlocks(40, 10, 3);
  const auto dst_blocks = ScatteredBlocks(30, 5, 4);
  FillPool(src, 9, src_blocks, 16 * 10);
  auto spec = client::MakeBlockTransfer(src.id(), src_blocks, dst.id(), dst_blocks);
  spec.set_digest(true);
  const v1::TransferStatus status = RunToEnd(*live.client, spec);
  INFO(status.error_message());
  REQUIRE(status.state() == v1::TRANSFER_STATE_SUCCEEDED);
  REQUIRE(status.has_digest());
  CHECK(status.digest().matched());
  CHECK(status.digest().tiles_checked() == status.tiles_total());
  CHECK(status.digest().source() == status.digest().destination());
  CHECK(status.digest().source() != 0);
  Expectation e{9, dst_blocks, 16 * 10, 0, 0, 4, 0, 0, 8};
  CHECK(VerifyPool(dst, e) == "");
  // The same bytes again with the digest off: no digest in the status.
  spec.set_digest(false);
  const v1::TransferStatus off = RunToEnd(*live.client, spec);
  REQUIRE(off.state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK_FALSE(off.has_digest());
}

TEST_CASE("MLA (one part), fp8, block-major layouts on both sides") {
  Live live;
  const auto layout =
      MakeLayout(3, 1, 32, 64, 1, 576, v1::DTYPE_FP8_E4M3, v1::LAYOUT_ORDER_BLOCK_LAYER_PART_NHD);
  Pool src = MakePool(*live.client, layout, false);
  Pool dst = MakePool(*live.client, layout, true);
  const auto src_blocks = ScatteredBlocks(32, 12, 5);
  const auto dst_blocks = ScatteredBlocks(32, 12, 6);
  FillPool(src, 3, src_blocks, 12 * 64);
  const auto status =
      RunToEnd(*live.client, client::MakeBlockTransfer(src.id(), src_blocks, dst.id(), dst_blocks));
  REQUIRE(status.state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(VerifyPool(dst, Expectation{3, dst_blocks, 12 * 64, 0, 0, 3, 0, 0, 1}) == "");
}

// Each bad request: the code, a message that names the field, nothing written, daemon alive.
TEST_CASE("bad requests are rejected naming the field; nothing moves; the daemon keeps serving") {
  Live live;
  const auto layout =
      MakeLayout(2, 2, 16, 16, 2, 64, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  Pool src = MakePool(*live.client, layout, false);
  Pool dst = MakePool(*live.client, layout, true);
  Pool readonly = MakePool(*live.client, layout, false);
  FillPool(src, 1, ScatteredBlocks(16, 16, 0), 16 * 16);
  const std::vector<uint32_t> four = {0, 1, 2, 3};

  auto expect_reject = [&](v1::TransferSpec spec, absl::StatusCode code, const std::string& field) {
    auto r = live.client->Submit(spec);
    INFO("expected " << field << ", got " << r.status().ToString());
    REQUIRE(!r.ok());
    CHECK(r.status().code() == code);
    CHECK(std::string(r.status().message()).find(field) != std::string::npos);
    CHECK(CountWritten(dst) == 0);
    CHECK(live.client->GetStats().ok());
  };

  auto good = client::MakeBlockTransfer(src.id(), four, dst.id(), four);
  SECTION("unknown source region") {
    auto s = good;
    s.mutable_src()->set_region_id(999999);
    expect_reject(s, absl::StatusCode::kNotFound, "spec.src.region_id");
  }
  SECTION("unknown destination region") {
    auto s = good;
    s.mutable_dst()->set_region_id(12345);
    expect_reject(s, absl::StatusCode::kNotFound, "spec.dst.region_id");
  }
  SECTION("a destination block out of range") {
    auto s = good;
    s.mutable_dst()->set_block_ids(2, 16);
    expect_reject(s, absl::StatusCode::kInvalidArgument, "spec.dst.block_ids[2]");
  }
  SECTION("a source block out of range") {
    auto s = good;
    s.mutable_src()->set_block_ids(0, 4000000000u);
    expect_reject(s, absl::StatusCode::kInvalidArgument, "spec.src.block_ids[0]");
  }
  SECTION("a read-only destination") {
    auto s = good;
    s.mutable_dst()->set_region_id(readonly.id());
    expect_reject(s, absl::StatusCode::kFailedPrecondition, "spec.dst.region_id");
  }
  SECTION("duplicate destination blocks") {
    auto s = client::MakeBlockTransfer(src.id(), four, dst.id(), {5, 6, 5, 7});
    expect_reject(s, absl::StatusCode::kInvalidArgument, "spec.dst.block_ids");
  }
  SECTION("too few destination blocks") {
    auto s = client::MakeBlockTransfer(src.id(), four, dst.id(), {5, 6});
    expect_reject(s, absl::StatusCode::kInvalidArgument, "spec.dst.block_ids");
  }
  SECTION("layers beyond the source") {
    auto s = good;
    s.mutable_src()->set_layer_begin(1);
    s.set_num_layers(2);
    expect_reject(s, absl::StatusCode::kInvalidArgument, "spec.");
  }
  SECTION("heads beyond the destination") {
    auto s = good;
    s.set_num_heads(2);
    s.mutable_dst()->set_head_begin(1);
    expect_reject(s, absl::StatusCode::kInvalidArgument, "spec.");
  }
  SECTION("another node without a fabric") {
    auto s = good;
    s.mutable_dst()->set_node_id("decode-7");
    expect_reject(s, absl::StatusCode::kUnimplemented, "spec.dst.node_id");
  }
  SECTION("an empty block list") {
    auto s = client::MakeBlockTransfer(src.id(), {}, dst.id(), {});
    expect_reject(s, absl::StatusCode::kInvalidArgument, "spec.src.block_ids");
  }
  // After all that, a good transfer still works.
  const auto status = RunToEnd(*live.client, good);
  CHECK(status.state() == v1::TRANSFER_STATE_SUCCEEDED);
}

TEST_CASE("bad regions are rejected naming the field") {
  Live live;
  auto buffer = live.client->CreateHostBuffer(1 << 20);
  REQUIRE(buffer.ok());
  auto expect_reject = [&](v1::RegionSpec spec, absl::StatusCode code, const std::string& field) {
    auto r = live.client->RegisterHostBuffer(**buffer, spec);
    INFO("expected " << field << ", got " << r.status().ToString());
    REQUIRE(!r.ok());
    CHECK(r.status().code() == code);
    CHECK(std::string(r.status().message()).find(field) != std::string::npos);
  };
  v1::RegionSpec good;
  good.set_memory_kind(v1::MEMORY_KIND_HOST);
  good.set_size_bytes(1 << 20);
  good.set_writable(true);
  *good.mutable_paged_kv() =
      MakeLayout(2, 2, 16, 16, 2, 64, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  SECTION("a layout larger than the memory") {
    auto s = good;
    s.mutable_paged_kv()->set_num_blocks(1000);
    expect_reject(s, absl::StatusCode::kInvalidArgument, "spec.paged_kv");
  }
  SECTION("a stride that leaves the region") {
    auto s = good;
    auto* l = s.mutable_paged_kv();
    l->set_head_stride(128);
    l->set_token_stride(256);
    l->set_block_stride(4096);
    l->set_part_stride(65536);
    l->set_layer_stride(1 << 20);
    expect_reject(s, absl::StatusCode::kInvalidArgument, "spec.paged_kv");
  }
  SECTION("overlapping strides") {
    auto s = good;
    auto* l = s.mutable_paged_kv();
    l->set_head_stride(64);  // a 128-byte head vector every 64 bytes
    l->set_token_stride(256);
    l->set_block_stride(4096);
    l->set_part_stride(65536);
    l->set_layer_stride(131072);
    expect_reject(s, absl::StatusCode::kInvalidArgument, "spec.paged_kv");
  }
  SECTION("no dtype") {
    auto s = good;
    s.mutable_paged_kv()->set_dtype(v1::DTYPE_UNSPECIFIED);
    expect_reject(s, absl::StatusCode::kInvalidArgument, "spec.paged_kv.dtype");
  }
  SECTION("zero size") {
    auto s = good;
    s.set_size_bytes(0);
    s.clear_paged_kv();
    s.mutable_bytes();
    // RegisterHostBuffer fills a zero size from the buffer; ask the daemon directly.
    auto r = live.client->RegisterRegion(s);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  }
  SECTION("a size beyond the shared memory") {
    auto s = good;
    s.set_size_bytes(4 << 20);
    s.mutable_paged_kv()->set_num_blocks(16);
    expect_reject(s, absl::StatusCode::kInvalidArgument, "spec.size_bytes");
  }
  SECTION("an unknown fd token") {
    auto s = good;
    s.mutable_share()->set_fd_token("00000000deadbeef");
    auto r = live.client->RegisterRegion(s);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == absl::StatusCode::kNotFound);
    CHECK(std::string(r.status().message()).find("spec.share.fd_token") != std::string::npos);
  }
  SECTION("an unknown shm name") {
    auto s = good;
    s.mutable_share()->set_shm_name("/kvrail-test-does-not-exist");
    auto r = live.client->RegisterRegion(s);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == absl::StatusCode::kNotFound);
    CHECK(std::string(r.status().message()).find("spec.share.shm_name") != std::string::npos);
  }
  SECTION("CUDA memory on a daemon without a CUDA engine") {
    auto s = good;
    s.set_memory_kind(v1::MEMORY_KIND_CUDA);
    auto r = live.client->RegisterRegion(s);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(std::string(r.status().message()).find("spec.memory_kind") != std::string::npos);
  }
  auto listed = live.client->ListRegions();
  REQUIRE(listed.ok());
  CHECK(listed->regions_size() == 0);
  // A good one still registers.
  CHECK(live.client->RegisterHostBuffer(**buffer, good).ok());
}

TEST_CASE("unregister, idempotency keys, cancel, unknown ids") {
  Live live;
  const auto layout =
      MakeLayout(2, 2, 64, 16, 4, 128, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  Pool src = MakePool(*live.client, layout, false);
  Pool dst = MakePool(*live.client, layout, true);
  const auto blocks = ScatteredBlocks(64, 8, 11);
  FillPool(src, 5, blocks, 8 * 16);
  auto spec = client::MakeBlockTransfer(src.id(), blocks, dst.id(), blocks);
  spec.set_idempotency_key("req-1");
  auto first = live.client->Submit(spec);
  REQUIRE(first.ok());
  CHECK(!first->deduplicated());
  auto second = live.client->Submit(spec);
  REQUIRE(second.ok());
  CHECK(second->deduplicated());
  CHECK(second->transfer_id() == first->transfer_id());
  auto status = live.client->Wait(first->transfer_id(), absl::Seconds(30));
  REQUIRE(status.ok());
  CHECK(status->state() == v1::TRANSFER_STATE_SUCCEEDED);
  // Cancelling an ended transfer leaves it as it was.
  auto cancelled = live.client->Cancel(first->transfer_id());
  REQUIRE(cancelled.ok());
  CHECK(cancelled->state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(live.client->Get(424242).status().code() == absl::StatusCode::kNotFound);
  CHECK(live.client->Cancel(424242).status().code() == absl::StatusCode::kNotFound);
  REQUIRE(live.client->UnregisterRegion(src.id()).ok());
  CHECK(live.client->UnregisterRegion(src.id()).code() == absl::StatusCode::kNotFound);
  spec.clear_idempotency_key();
  auto after = live.client->Submit(spec);
  REQUIRE(!after.ok());
  CHECK(after.status().code() == absl::StatusCode::kNotFound);
  CHECK(std::string(after.status().message()).find("spec.src.region_id") != std::string::npos);
}

TEST_CASE("layer-wise: layers move when marked ready, in readiness order, with per-layer events") {
  Live live;
  const auto layout =
      MakeLayout(4, 2, 16, 16, 2, 64, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  Pool src = MakePool(*live.client, layout, false);
  Pool dst = MakePool(*live.client, layout, true);
  const auto blocks = ScatteredBlocks(16, 4, 2);
  FillPool(src, 2, blocks, 4 * 16);
  auto spec = client::MakeBlockTransfer(src.id(), blocks, dst.id(), blocks);
  spec.set_layerwise(true);
  auto submitted = live.client->Submit(spec);
  REQUIRE(submitted.ok());
  const uint64_t id = submitted->transfer_id();
  // Nothing moves before a layer is ready.
  auto waited = live.client->Wait(id, absl::Milliseconds(200));
  REQUIRE(waited.ok());
  CHECK(waited->state() == v1::TRANSFER_STATE_QUEUED);
  CHECK(CountWritten(dst) == 0);
  std::mutex mu;
  std::vector<uint32_t> layer_events;
  std::atomic<bool> watching{false};
  std::thread watcher([&] {
    auto final_status = live.client->Watch(id, [&](const v1::TransferEvent& e) {
      if (e.kind() == v1::TransferEvent::KIND_SNAPSHOT) watching = true;
      std::lock_guard<std::mutex> lock(mu);
      if (e.kind() == v1::TransferEvent::KIND_LAYER_DONE) layer_events.push_back(e.layer());
      return true;
    });
    CHECK(final_status.ok());
  });
  while (!watching) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  uint32_t marked = 0;
  for (uint32_t layer : {2u, 0u, 3u, 1u}) {
    REQUIRE(live.client->MarkReady(id, layer, 1).ok());
    // Wait for the layer to land before marking the next, so readiness order is observable (not
    // a time bound: on a loaded CI machine under ASan a layer may take longer than a second).
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    uint32_t done = 0;
    while (std::chrono::steady_clock::now() < until) {
      auto s = live.client->Get(id);
      REQUIRE(s.ok());
      done = s->layers_done();
      if (done > marked) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    INFO("layer " << layer);
    REQUIRE(done == marked + 1);
    ++marked;
  }
  CHECK(live.client->MarkReady(id, 9, 1).code() == absl::StatusCode::kOutOfRange);
  auto done = live.client->Wait(id, absl::Seconds(10));
  REQUIRE(done.ok());
  CHECK(done->state() == v1::TRANSFER_STATE_SUCCEEDED);
  watcher.join();
  CHECK(layer_events == std::vector<uint32_t>{2, 0, 3, 1});
  CHECK(VerifyPool(dst, Expectation{2, blocks, 4 * 16, 0, 0, 4, 0, 0, 2}) == "");
}

TEST_CASE("a layer-wise transfer whose layers never come is failed at its deadline, untouched") {
  Live live;
  const auto layout =
      MakeLayout(2, 2, 8, 16, 2, 64, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  Pool src = MakePool(*live.client, layout, false);
  Pool dst = MakePool(*live.client, layout, true);
  auto spec = client::MakeBlockTransfer(src.id(), {0, 1}, dst.id(), {2, 3});
  spec.set_layerwise(true);
  spec.set_timeout_ms(100);
  auto submitted = live.client->Submit(spec);
  REQUIRE(submitted.ok());
  auto status = live.client->Wait(submitted->transfer_id(), absl::Seconds(10));
  REQUIRE(status.ok());
  CHECK(status->state() == v1::TRANSFER_STATE_FAILED);
  CHECK(status->error_code() == static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  CHECK(CountWritten(dst) == 0);
  // Cancelling a queued layer-wise transfer ends it at once.
  spec.set_timeout_ms(0);
  auto second = live.client->Submit(spec);
  REQUIRE(second.ok());
  auto cancelled = live.client->Cancel(second->transfer_id());
  REQUIRE(cancelled.ok());
  CHECK(cancelled->state() == v1::TRANSFER_STATE_CANCELLED);
  CHECK(CountWritten(dst) == 0);
}

}  // namespace
}  // namespace kvrail::testing

namespace kvrail::testing {
namespace {

// Flag words in a shared host buffer: the producer's word releases a layer without an RPC, the
// daemon's word says the layer landed (what a GPU stream would write / wait on).
TEST_CASE("ready and arrival flags in shared memory drive a layer-wise transfer") {
  Live live;
  const auto layout =
      MakeLayout(4, 2, 16, 16, 2, 64, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  Pool src = MakePool(*live.client, layout, false);
  Pool dst = MakePool(*live.client, layout, true);
  const auto blocks = ScatteredBlocks(16, 4, 9);
  FillPool(src, 6, blocks, 4 * 16);
  auto flag_buffer = live.client->CreateHostBuffer(4096);
  REQUIRE(flag_buffer.ok());
  auto* words = reinterpret_cast<volatile uint32_t*>((*flag_buffer)->data());
  for (int i = 0; i < 1024; ++i) words[i] = 4;  // an older epoch
  v1::RegionSpec flags_spec;
  flags_spec.set_name("flags");
  flags_spec.set_memory_kind(v1::MEMORY_KIND_HOST);
  flags_spec.set_writable(true);
  flags_spec.mutable_bytes();
  auto flags = live.client->RegisterHostBuffer(**flag_buffer, flags_spec);
  REQUIRE(flags.ok());

  auto spec = client::MakeBlockTransfer(src.id(), blocks, dst.id(), blocks);
  spec.mutable_ready_flags()->set_region_id(flags->region_id());
  spec.mutable_ready_flags()->set_byte_offset(0);
  spec.mutable_ready_flags()->set_value(5);
  spec.mutable_arrival_flags()->set_region_id(flags->region_id());
  spec.mutable_arrival_flags()->set_byte_offset(1024);
  spec.mutable_arrival_flags()->set_value(5);

  SECTION("bad flag arrays are rejected naming the field") {
    auto expect = [&](v1::TransferSpec s, absl::StatusCode code, const std::string& field) {
      auto r = live.client->Submit(s);
      INFO(r.status().ToString());
      REQUIRE(!r.ok());
      CHECK(r.status().code() == code);
      CHECK(std::string(r.status().message()).find(field) != std::string::npos);
    };
    auto s = spec;
    s.mutable_ready_flags()->set_byte_offset(2);
    expect(s, absl::StatusCode::kInvalidArgument, "spec.ready_flags.byte_offset");
    s = spec;
    s.mutable_arrival_flags()->set_value(0);
    expect(s, absl::StatusCode::kInvalidArgument, "spec.arrival_flags.value");
    s = spec;
    s.mutable_arrival_flags()->set_byte_offset(4096 - 8);  // 2 words left, 4 layers
    expect(s, absl::StatusCode::kInvalidArgument, "spec.arrival_flags.byte_offset");
    s = spec;
    s.mutable_arrival_flags()->set_region_id(src.id());  // read-only
    expect(s, absl::StatusCode::kFailedPrecondition, "spec.arrival_flags.region_id");
    s = spec;
    s.mutable_ready_flags()->set_region_id(777777);
    expect(s, absl::StatusCode::kNotFound, "spec.ready_flags.region_id");
    CHECK(CountWritten(dst) == 0);
  }

  SECTION("layers move as their ready words are written; arrival words follow") {
    auto submitted = live.client->Submit(spec);
    REQUIRE(submitted.ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK(CountWritten(dst) == 0);  // old epochs release nothing
    for (uint32_t layer : {2u, 0u, 3u, 1u}) {
      __atomic_store_n(const_cast<uint32_t*>(&words[layer]), 5u, __ATOMIC_RELEASE);
      // Waited for by its arrival word, 20 s at most (liveness, not a time bound: the watcher
      // and the copy may wait long for a core on a loaded CI machine under ASan).
      bool arrived = false;
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (!arrived && std::chrono::steady_clock::now() < until) {
        arrived =
            __atomic_load_n(const_cast<uint32_t*>(&words[256 + layer]), __ATOMIC_ACQUIRE) == 5;
        if (!arrived) std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      INFO("layer " << layer);
      REQUIRE(arrived);
    }
    auto done = live.client->Wait(submitted->transfer_id(), absl::Seconds(10));
    REQUIRE(done.ok());
    CHECK(done->state() == v1::TRANSFER_STATE_SUCCEEDED);
    CHECK(VerifyPool(dst, Expectation{6, blocks, 4 * 16, 0, 0, 4, 0, 0, 2}) == "");
    for (int i = 0; i < 4; ++i) CHECK(words[256 + i] == 5);
    CHECK(words[256 + 4] == 4);  // nothing beyond the transfer's layers
  }
}

}  // namespace
}  // namespace kvrail::testing
