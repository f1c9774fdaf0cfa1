// Pure helpers of the client library and the CLI: block lists, layout arithmetic, formatting.
// (FromGrpcStatus's case moved to base/grpc_status_test.cc with the conversion.)
#include "tools/kvrail/block_list.h"

#include <catch2/catch.hpp>

#include "client/kvrail_client.h"
#include "tools/kvrail/cli_format.h"

namespace kvrail::client {
namespace {

using cli::FormatBlockList;
using cli::ParseBlockList;
using Ids = std::vector<uint32_t>;

TEST_CASE("ParseBlockList accepts singles, ranges and whitespace, keeping order") {
  auto ids = ParseBlockList("0-3,200, 7 ,300-302");
  REQUIRE(ids.ok());
  CHECK(*ids == Ids{0, 1, 2, 3, 200, 7, 300, 301, 302});
  CHECK(*ParseBlockList("5") == Ids{5});
  CHECK(*ParseBlockList("4-4") == Ids{4});
  CHECK(*ParseBlockList("4294967295") == Ids{4294967295u});
  CHECK(ParseBlockList("0-99")->size() == 100);
  // Repeats are the daemon's business (allowed on the source side).
  CHECK(*ParseBlockList("1,1") == Ids{1, 1});
}

TEST_CASE("ParseBlockList rejects bad input with a message naming the item") {
  auto expect_error = [](const char* text, const char* fragment) {
    auto ids = ParseBlockList(text);
    INFO(text);
    REQUIRE_FALSE(ids.ok());
    CHECK(ids.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(ids.status().message()), Catch::Contains(fragment));
  };
  expect_error("", "empty block list");
  expect_error("   ", "empty block list");
  expect_error("1,,2", "empty");
  expect_error("1,", "empty");
  expect_error("abc", "\"abc\" is not a non-negative integer");
  expect_error("-5", "missing number");
  expect_error("5-", "missing number");
  expect_error("1-2-3", "not a non-negative integer");
  expect_error("10-2", "range end 2 is below its start 10");
  expect_error("4294967296", "larger than 4294967295");
  expect_error("99999999999999999999999", "larger than");
  expect_error("+3", "not a non-negative integer");
  expect_error("0x10", "not a non-negative integer");
}

TEST_CASE("ParseBlockList caps the number of ids") {
  CHECK(ParseBlockList("0-9", 10).ok());
  auto too_many = ParseBlockList("0-9,10", 10);
  REQUIRE_FALSE(too_many.ok());
  CHECK_THAT(std::string(too_many.status().message()), Catch::Contains("more than 10"));
  // A huge range fails fast instead of allocating 4 billion ids.
  CHECK_FALSE(ParseBlockList("0-4294967295").ok());
}

TEST_CASE("FormatBlockList compresses runs and round-trips") {
  CHECK(FormatBlockList({}) == "");
  CHECK(FormatBlockList({0, 1, 2, 3, 7}) == "0-3,7");
  CHECK(FormatBlockList({5, 4, 3}) == "5,4,3");
  CHECK(FormatBlockList({4294967294u, 4294967295u}) == "4294967294-4294967295");
  const Ids ids = {9, 10, 11, 2, 40, 41, 0};
  CHECK(*ParseBlockList(FormatBlockList(ids)) == ids);
}

v1::PagedKvLayout Llama8B(v1::LayoutOrder order) {
  v1::PagedKvLayout l;
  l.set_num_layers(32);
  l.set_num_parts(2);
  l.set_num_blocks(1024);
  l.set_tokens_per_block(16);
  l.set_num_heads(8);
  l.set_head_dim(128);
  l.set_dtype(v1::DTYPE_BF16);
  l.set_order(order);
  return l;
}

TEST_CASE("ResolveStrides derives dense strides from the order") {
  const uint64_t vec = 256;
  auto nhd = ResolveStrides(Llama8B(v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD));
  REQUIRE(nhd.ok());
  CHECK(nhd->head == vec);
  CHECK(nhd->token == 8 * vec);
  CHECK(nhd->block == 16 * 8 * vec);
  CHECK(nhd->part == 1024 * nhd->block);
  CHECK(nhd->layer == 2 * nhd->part);

  auto hnd = ResolveStrides(Llama8B(v1::LAYOUT_ORDER_LAYER_PART_BLOCK_HND));
  REQUIRE(hnd.ok());
  CHECK(hnd->token == vec);
  CHECK(hnd->head == 16 * vec);

  auto block_major = ResolveStrides(Llama8B(v1::LAYOUT_ORDER_BLOCK_LAYER_PART_NHD));
  REQUIRE(block_major.ok());
  CHECK(block_major->block == 32 * 2 * 16 * 8 * vec);

  auto kv_adjacent = ResolveStrides(Llama8B(v1::LAYOUT_ORDER_LAYER_BLOCK_PART_NHD));
  REQUIRE(kv_adjacent.ok());
  CHECK(kv_adjacent->part == 16 * 8 * vec);
  CHECK(kv_adjacent->block == 2 * kv_adjacent->part);
  CHECK(kv_adjacent->layer == 1024 * kv_adjacent->block);

  // Every dense order covers exactly the pool's bytes.
  for (auto order : {v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_HND,
                     v1::LAYOUT_ORDER_BLOCK_LAYER_PART_NHD, v1::LAYOUT_ORDER_BLOCK_LAYER_PART_HND,
                     v1::LAYOUT_ORDER_LAYER_BLOCK_PART_NHD}) {
    INFO(v1::LayoutOrder_Name(order));
    CHECK(*PagedLayoutBytes(Llama8B(order)) == uint64_t{32} * 2 * 1024 * 16 * 8 * 128 * 2);
  }
}

TEST_CASE("ResolveStrides keeps explicit strides and rejects incomplete layouts") {
  auto l = Llama8B(v1::LAYOUT_ORDER_UNSPECIFIED);
  CHECK_FALSE(ResolveStrides(l).ok());
  l.set_head_stride(512);  // padded heads
  l.set_token_stride(4096);
  l.set_block_stride(65536);
  l.set_part_stride(65536ull * 1024);
  l.set_layer_stride(65536ull * 1024 * 2);
  auto s = ResolveStrides(l);
  REQUIRE(s.ok());
  CHECK(s->head == 512);
  l.set_offset_bytes(100);
  CHECK(PagedOffset(l, *s, 1, 1, 2, 3, 4) ==
        100 + 65536ull * 1024 * 3 + 2 * 65536 + 3 * 4096 + 4 * 512);
  l.set_dtype(v1::DTYPE_UNSPECIFIED);
  CHECK_FALSE(ResolveStrides(l).ok());
  auto zero = Llama8B(v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  zero.set_num_heads(0);
  CHECK_FALSE(ResolveStrides(zero).ok());
}

TEST_CASE("DTypeSize, IsFinal, MakeBlockTransfer") {
  CHECK(DTypeSize(v1::DTYPE_BF16) == 2);
  CHECK(DTypeSize(v1::DTYPE_FP32) == 4);
  CHECK(DTypeSize(v1::DTYPE_FP8_E4M3) == 1);
  CHECK(DTypeSize(v1::DTYPE_UNSPECIFIED) == 0);
  CHECK(IsFinal(v1::TRANSFER_STATE_SUCCEEDED));
  CHECK(IsFinal(v1::TRANSFER_STATE_CANCELLED));
  CHECK_FALSE(IsFinal(v1::TRANSFER_STATE_RUNNING));
  auto spec = MakeBlockTransfer(3, {1, 2}, 4, {7, 9});
  CHECK(spec.src().region_id() == 3);
  CHECK(spec.dst().block_ids_size() == 2);
  CHECK(spec.dst().block_ids(1) == 9);
}

namespace cli_tests {
using namespace kvrail::client::cli;

TEST_CASE("Human sizes, rates and durations") {
  CHECK(HumanBytes(0) == "0 B");
  CHECK(HumanBytes(1023) == "1023 B");
  CHECK(HumanBytes(1536) == "1.5 KiB");
  CHECK(HumanBytes(512ull << 20) == "512.0 MiB");
  CHECK(HumanBytes(3ull << 30) == "3.0 GiB");
  CHECK(HumanBytes(5ull << 40) == "5.0 TiB");
  CHECK(HumanRate(2'000'000'000, 1.0) == "2.00 GB/s");
  CHECK(HumanRate(1, 0) == "-");
  CHECK(HumanDuration(absl::Milliseconds(850)) == "850ms");
  CHECK(HumanDuration(absl::Milliseconds(12345)) == "12.3s");
  CHECK(HumanDuration(absl::Seconds(245)) == "4m05s");
  CHECK(HumanDuration(absl::Minutes(192)) == "3h12m");
  CHECK(HumanDuration(absl::Hours(52)) == "2d04h");
  CHECK(HumanDuration(-absl::Seconds(1)) == "0ms");
}

TEST_CASE("Enum names and parsers") {
  CHECK(StateName(v1::TRANSFER_STATE_RUNNING) == "running");
  CHECK(PriorityName(v1::PRIORITY_UNSPECIFIED) == "normal");
  CHECK(PriorityName(v1::PRIORITY_BACKGROUND) == "background");
  CHECK(PathName(v1::PATH_NVLINK_P2P) == "nvlink_p2p");
  CHECK(PathName(v1::PATH_UNSPECIFIED) == "-");
  auto states = ParseStates("running, QUEUED,TRANSFER_STATE_FAILED");
  REQUIRE(states.ok());
  CHECK(*states == std::vector<v1::TransferState>{v1::TRANSFER_STATE_RUNNING,
                                                  v1::TRANSFER_STATE_QUEUED,
                                                  v1::TRANSFER_STATE_FAILED});
  CHECK_FALSE(ParseStates("runing").ok());
  CHECK_FALSE(ParseStates("").ok());
  CHECK(*ParsePriority("Critical") == v1::PRIORITY_CRITICAL);
  CHECK_FALSE(ParsePriority("urgent").ok());
}

TEST_CASE("Layout summaries") {
  v1::RegionSpec spec;
  CHECK(LayoutSummary(spec) == "-");
  spec.mutable_bytes();
  CHECK(LayoutSummary(spec) == "bytes");
  *spec.mutable_paged_kv() = Llama8B(v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  spec.mutable_paged_kv()->set_num_blocks(4096);
  CHECK(LayoutSummary(spec) == "paged 32L×2P×4096B×16T×8H×128D bf16 NHD");
  spec.mutable_paged_kv()->set_head_stride(512);
  CHECK(LayoutSummary(spec) == "paged 32L×2P×4096B×16T×8H×128D bf16 strided");
  spec.set_memory_kind(v1::MEMORY_KIND_CUDA);
  spec.set_device(3);
  CHECK(KindDevice(spec) == "cuda:3");
}

TEST_CASE("Endpoint summaries") {
  v1::TransferEndpoint e;
  e.set_region_id(3);
  CHECK(EndpointSummary(e, false) == "region 3 blocks not reported, layers from 0 heads from 0");
  e.add_block_ids(4);
  e.add_block_ids(5);
  e.set_layer_begin(2);
  CHECK(EndpointSummary(e, false) == "region 3 blocks[2]=4-5 layers from 2 heads from 0");
  e.set_byte_offset(4096);
  e.set_node_id("n2");
  CHECK(EndpointSummary(e, true) == "region 3@n2 bytes from offset 4096");
}

TEST_CASE("Table aligns columns, counting UTF-8 code points") {
  Table table({"ID", "LAYOUT", "SIZE"});
  table.RightAlign(2);
  table.AddRow({"1", "a×b", "1.0 KiB"});
  table.AddRow({"22", "bytes", "12 B"});
  CHECK(table.Render() ==
        "ID  LAYOUT     SIZE\n"
        "1   a×b     1.0 KiB\n"
        "22  bytes      12 B\n");
}

TEST_CASE("Progress line") {
  v1::TransferStatus status;
  status.set_bytes_total(1024);
  status.set_bytes_done(512);
  status.set_layers_done(16);
  status.set_state(v1::TRANSFER_STATE_RUNNING);
  CHECK(ProgressLine(status, 32, 1.5, 10) ==
        "[#####.....]  50.0%  512 B / 1.0 KiB  1.50 GB/s  layers 16/32  running");
  CHECK(ProgressLine(status, 0, -1, 4) == "[##..]  50.0%  512 B / 1.0 KiB  running");
  CHECK(ProgressLine(status, 0, -1, 0) == " 50.0%  512 B / 1.0 KiB  running");
}

}  // namespace cli_tests
}  // namespace
}  // namespace kvrail::client
