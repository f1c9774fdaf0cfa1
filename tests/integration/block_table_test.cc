// Block tables in shared memory (TransferEndpoint.block_table): the client library's automatic
// path for large tables, an explicit BlockTableRef, the copy-once contract (rewriting the memory
// after SubmitTransfer returns changes nothing), and bad references rejected naming the field.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>

#include "tests/integration/kv_fixture.h"

namespace kvrail::testing {
namespace {

// 16384 blocks of 16 tokens x 1 head x 8 dims (bf16): 256-byte elements, 8 MiB per pool.
v1::PagedKvLayout ManyBlocks() {
  return MakeLayout(1, 2, 16384, 16, 1, 8, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
}

// A host region holding `ids` (little-endian uint32) at byte `offset`.
struct Table {
  std::unique_ptr<client::HostBuffer> buffer;
  v1::RegionInfo info;
};
Table MakeTable(client::Client& c, const std::vector<uint32_t>& ids, uint64_t offset) {
  Table t;
  auto buffer = c.CreateHostBuffer(offset + 4 * ids.size() + 64);
  REQUIRE(buffer.ok());
  t.buffer = *std::move(buffer);
  std::memcpy(t.buffer->data() + offset, ids.data(), 4 * ids.size());
  v1::RegionSpec spec;
  spec.set_name("tables");
  auto info = c.RegisterHostBuffer(*t.buffer, spec);
  REQUIRE(info.ok());
  t.info = *info;
  return t;
}

void Refer(v1::TransferEndpoint* ep, uint64_t region, uint64_t offset, uint32_t count) {
  ep->clear_block_ids();
  ep->clear_block_ids_le32();
  ep->mutable_block_table()->set_region_id(region);
  ep->mutable_block_table()->set_offset_bytes(offset);
  ep->mutable_block_table()->set_count(count);
}

TEST_CASE("a 10000-block transfer: the client passes its tables through shared memory") {
  LiveDaemon live;
  Pool src = MakePool(*live.client, ManyBlocks(), false, "prefill");
  Pool dst = MakePool(*live.client, ManyBlocks(), true, "decode");
  const auto src_blocks = ScatteredBlocks(16384, 10000, 1);
  const auto dst_blocks = ScatteredBlocks(16384, 10000, 2);
  FillPool(src, 3, src_blocks, 10000 * 16);
  v1::TransferStatus status =
      RunToEnd(*live.client, client::MakeBlockTransfer(src.id(), src_blocks, dst.id(), dst_blocks));
  INFO(status.error_message());
  REQUIRE(status.state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(VerifyPool(dst, Expectation{3, dst_blocks, 10000 * 16, 0, 0, 1, 0, 0, 1}) == "");
  // The tables went through the client's table region (listed only on request), not the message.
  auto regions = live.client->ListRegions(/*include_library_regions=*/true);
  REQUIRE(regions.ok());
  bool table_region = false;
  for (const auto& r : regions->regions()) {
    table_region |= r.spec().library_region();
  }
  CHECK(table_region);
  // A second, larger pair of tables (into a fresh pool) grows it; still verified.
  Pool dst2 = MakePool(*live.client, ManyBlocks(), true, "decode2");
  const auto more_src = ScatteredBlocks(16384, 16000, 5);
  const auto more_dst = ScatteredBlocks(16384, 16000, 6);
  FillPool(src, 4, more_src, 16000 * 16);
  status =
      RunToEnd(*live.client, client::MakeBlockTransfer(src.id(), more_src, dst2.id(), more_dst));
  REQUIRE(status.state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(VerifyPool(dst2, Expectation{4, more_dst, 16000 * 16, 0, 0, 1, 0, 0, 1}) == "");
}

// The first transfer: Connect creates and registers the table region, so the first large
// Submit neither creates nor registers one; the caller's region list leaves it out.
TEST_CASE(
    "the table region exists from Connect, is not listed by default, and the first large Submit "
    "adds none") {
  LiveDaemon live;
  auto Count = [&](bool include_library) {
    auto listed = live.client->ListRegions(include_library);
    REQUIRE(listed.ok());
    std::vector<uint64_t> tables;
    for (const auto& r : listed->regions()) {
      if (r.spec().library_region()) tables.push_back(r.region_id());
    }
    return std::make_pair(listed->regions_size(), tables);
  };
  const auto [all, tables] = Count(true);
  REQUIRE(tables.size() == 1);  // registered by Connect (before: only on the first large Submit)
  CHECK(all == 1);
  CHECK(Count(false).first == 0);  // the caller's list leaves it out
  // Another client's table region is left out of this client's list too.
  auto other = client::Client::Connect(live.daemon.socket());
  REQUIRE(other.ok());
  CHECK(Count(false).first == 0);
  CHECK(Count(true).second.size() == 2);
  Pool src = MakePool(*live.client, ManyBlocks(), false, "prefill");
  Pool dst = MakePool(*live.client, ManyBlocks(), true, "decode");
  CHECK(Count(false).first == 2);
  const auto src_blocks = ScatteredBlocks(16384, 10000, 7);
  const auto dst_blocks = ScatteredBlocks(16384, 10000, 8);
  FillPool(src, 9, src_blocks, 10000 * 16);
  v1::TransferStatus status =
      RunToEnd(*live.client, client::MakeBlockTransfer(src.id(), src_blocks, dst.id(), dst_blocks));
  REQUIRE(status.state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(VerifyPool(dst, Expectation{9, dst_blocks, 10000 * 16, 0, 0, 1, 0, 0, 1}) == "");
  // The same table region carried it: nothing new registered by the Submit.
  const auto after = Count(true);
  CHECK(after.first == 4);
  CHECK(after.second.size() == 2);  // this client's and the other's
  CHECK(std::find(after.second.begin(), after.second.end(), tables[0]) != after.second.end());
}

// The library's region is known by its flag (RegionSpec.library_region), not its name: a caller's
// region named "client block tables" is listed like any other (before, the name hid it), and the
// library's own region is no transfer endpoint.
TEST_CASE("a caller's region named like the table region is an ordinary, listed region") {
  LiveDaemon live;
  auto buffer = live.client->CreateHostBuffer(1 << 20);
  REQUIRE(buffer.ok());
  v1::RegionSpec spec;
  spec.set_name(client::kBlockTableRegionName);
  auto mine = live.client->RegisterHostBuffer(**buffer, spec);
  REQUIRE(mine.ok());
  CHECK_FALSE(mine->spec().library_region());
  auto listed = live.client->ListRegions();
  REQUIRE(listed.ok());
  REQUIRE(listed->regions_size() == 1);
  CHECK(listed->regions(0).region_id() == mine->region_id());
  auto all = live.client->ListRegions(/*include_library_regions=*/true);
  REQUIRE(all.ok());
  uint64_t library = 0;
  for (const auto& r : all->regions()) {
    if (r.spec().library_region()) library = r.region_id();
  }
  REQUIRE(library != 0);
  // The library's region as a transfer's source: refused naming the field, for its own session.
  v1::TransferSpec bytes;
  bytes.mutable_src()->set_region_id(library);
  bytes.mutable_dst()->set_region_id(mine->region_id());
  bytes.set_num_bytes(64);
  auto refused = live.client->Submit(bytes);
  INFO(refused.status().ToString());
  CHECK(refused.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(std::string(refused.status().message()).find("spec.src.region_id") != std::string::npos);
}

TEST_CASE(
    "a bad id in a large table the client moved to shared memory is named as the caller set it") {
  LiveDaemon live;
  Pool src = MakePool(*live.client, ManyBlocks(), false, "prefill");
  Pool dst = MakePool(*live.client, ManyBlocks(), true, "decode");
  const auto src_blocks = ScatteredBlocks(16384, 10000, 3);
  auto dst_blocks = ScatteredBlocks(16384, 10000, 4);
  dst_blocks[5] = 20000;  // past the pool
  auto r =
      live.client->Submit(client::MakeBlockTransfer(src.id(), src_blocks, dst.id(), dst_blocks));
  INFO(r.status().ToString());
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(r.status().message()).rfind("spec.dst.block_ids[5]", 0) == 0);
  CHECK(CountWritten(dst) == 0);
}

TEST_CASE("tables past defer_id_checks_from: accepted, then failed at a bad id before it is used") {
  // One part, 16384 blocks of 256 bytes: 4 tiles of 4096 blocks. One host thread runs them in
  // order, so exactly the tiles before the bad id's move.
  const v1::PagedKvLayout layout =
      MakeLayout(1, 1, 16384, 16, 1, 8, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  const auto src_blocks = ScatteredBlocks(16384, 16384, 11);
  auto dst_blocks = ScatteredBlocks(16384, 16384, 12);
  dst_blocks[16000] = dst_blocks[10];  // tile 3 writes it again
  {
    LiveDaemon live({"--host-threads", "1"});  // default threshold: 32768 ids
    Pool src = MakePool(*live.client, layout, false, "prefill");
    Pool dst = MakePool(*live.client, layout, true, "decode");
    FillPool(src, 6, src_blocks, 16384 * 16);
    auto submitted =
        live.client->Submit(client::MakeBlockTransfer(src.id(), src_blocks, dst.id(), dst_blocks));
    INFO(submitted.status().ToString());
    REQUIRE(submitted.ok());
    auto status = live.client->Wait(submitted->transfer_id(), absl::Seconds(60));
    REQUIRE(status.ok());
    INFO(status->error_message());
    CHECK(status->state() == v1::TRANSFER_STATE_FAILED);
    CHECK(status->error_code() == static_cast<int>(absl::StatusCode::kInvalidArgument));
    CHECK(status->error_message().rfind("spec.dst.block_ids[16000]: block " +
                                            std::to_string(dst_blocks[10]) +
                                            " repeats spec.dst.block_ids[10]",
                                        0) == 0);
    // Tiles 0-2 moved; the failing tile wrote nothing, not even the first 16000 - 12288 blocks
    // it holds; poison everywhere else.
    const std::vector<uint32_t> moved(dst_blocks.begin(), dst_blocks.begin() + 12288);
    CHECK(VerifyPool(dst, Expectation{6, moved, 12288 * 16, 0, 0, 1, 0, 0, 1}) == "");
  }
  {
    // 0: every id checked before the answer; nothing moves.
    LiveDaemon live({"--defer-id-checks-from", "0"});
    Pool src = MakePool(*live.client, layout, false, "prefill");
    Pool dst = MakePool(*live.client, layout, true, "decode");
    auto r =
        live.client->Submit(client::MakeBlockTransfer(src.id(), src_blocks, dst.id(), dst_blocks));
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(r.status().message()).rfind("spec.dst.block_ids[16000]", 0) == 0);
    CHECK(CountWritten(dst) == 0);
  }
}

TEST_CASE(
    "an explicit BlockTableRef is copied at submit: rewriting it afterwards changes nothing") {
  LiveDaemon live;
  Pool src = MakePool(*live.client, ManyBlocks(), false, "prefill");
  Pool dst = MakePool(*live.client, ManyBlocks(), true, "decode");
  const auto src_blocks = ScatteredBlocks(16384, 300, 7);
  const auto dst_blocks = ScatteredBlocks(16384, 300, 8);
  FillPool(src, 5, src_blocks, 300 * 16);
  std::vector<uint32_t> both = src_blocks;
  both.insert(both.end(), dst_blocks.begin(), dst_blocks.end());
  Table table = MakeTable(*live.client, both, 40);
  v1::TransferSpec spec = client::MakeBlockTransfer(src.id(), {}, dst.id(), {});
  Refer(spec.mutable_src(), table.info.region_id(), 40, 300);
  Refer(spec.mutable_dst(), table.info.region_id(), 40 + 4 * 300, 300);
  spec.set_layerwise(true);  // nothing moves until MarkReady
  auto submitted = live.client->Submit(spec);
  INFO(submitted.status().ToString());
  REQUIRE(submitted.ok());
  // Point every destination id elsewhere; the daemon already holds its copy.
  const auto other = ScatteredBlocks(16384, 300, 9);
  std::memcpy(table.buffer->data() + 40 + 4 * 300, other.data(), 4 * 300);
  REQUIRE(live.client->MarkReady(submitted->transfer_id(), 0, 1).ok());
  auto status = live.client->Wait(submitted->transfer_id(), absl::Seconds(60));
  REQUIRE(status.ok());
  REQUIRE(status->state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(VerifyPool(dst, Expectation{5, dst_blocks, 300 * 16, 0, 0, 1, 0, 0, 1}) == "");
}

TEST_CASE("bad block table references are rejected naming the field; nothing moves") {
  LiveDaemon live;
  Pool src = MakePool(*live.client, ManyBlocks(), false, "prefill");
  Pool dst = MakePool(*live.client, ManyBlocks(), true, "decode");
  const auto ids = ScatteredBlocks(16384, 8, 1);
  std::vector<uint32_t> bad = ids;
  bad[3] = 16384;  // past the pool
  Table table = MakeTable(*live.client, ids, 0);
  Table bad_table = MakeTable(*live.client, bad, 0);
  const auto expect = [&](const v1::TransferSpec& spec, absl::StatusCode code,
                          const std::string& field) {
    auto r = live.client->Submit(spec);
    INFO(r.status().ToString());
    REQUIRE(!r.ok());
    CHECK(r.status().code() == code);
    CHECK(std::string(r.status().message()).rfind(field, 0) == 0);
  };
  v1::TransferSpec good = client::MakeBlockTransfer(src.id(), ids, dst.id(), ids);
  v1::TransferSpec s = good;
  Refer(s.mutable_src(), 987654, 0, 8);
  expect(s, absl::StatusCode::kNotFound, "spec.src.block_table.region_id");
  s = good;
  Refer(s.mutable_dst(), table.info.region_id(), 8, 1000);
  expect(s, absl::StatusCode::kInvalidArgument, "spec.dst.block_table.count");
  s = good;
  Refer(s.mutable_dst(), table.info.region_id(), ~uint64_t{0} - 2, 1);
  expect(s, absl::StatusCode::kInvalidArgument, "spec.dst.block_table.count");
  s = good;
  s.mutable_src()->mutable_block_table()->set_region_id(table.info.region_id());
  s.mutable_src()->mutable_block_table()->set_count(8);
  expect(s, absl::StatusCode::kInvalidArgument, "spec.src.block_table");
  s = good;
  Refer(s.mutable_dst(), bad_table.info.region_id(), 0, 8);
  expect(s, absl::StatusCode::kInvalidArgument, "spec.dst.block_table[3]");
  s.mutable_dst()->mutable_block_table()->set_named_as("block_ids");
  expect(s, absl::StatusCode::kInvalidArgument, "spec.dst.block_ids[3]");
  s.mutable_dst()->mutable_block_table()->set_named_as("ids");
  expect(s, absl::StatusCode::kInvalidArgument, "spec.dst.block_table.named_as");
  CHECK(CountWritten(dst) == 0);
  // Still serving: the good one moves.
  s = good;
  Refer(s.mutable_src(), table.info.region_id(), 0, 8);
  CHECK(RunToEnd(*live.client, s).state() == v1::TRANSFER_STATE_SUCCEEDED);
}

}  // namespace
}  // namespace kvrail::testing
