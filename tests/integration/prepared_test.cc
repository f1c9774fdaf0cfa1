// Prepared transfers against a real kvraild (host engine): a shape prepared once and posted many
// times with new block ids moves exactly those blocks (every other destination byte keeps its
// poison), over the session socket's POST and over gRPC; what a post must still check is
// checked there too (ids, another session's prepared id, an unregistered region, a release).
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "tests/integration/kv_fixture.h"

namespace kvrail::testing {
namespace {

// 2 layers x 2 parts x 64 blocks of 16 tokens x 2 heads x 8 bf16: 512 bytes a block and part.
v1::PagedKvLayout Small() {
  return MakeLayout(2, 2, 64, 16, 2, 8, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
}
constexpr uint32_t kBlocks = 64;
constexpr uint64_t kBlockBytes = 16 * 2 * 8 * 2;

const uint8_t* At(const Pool& pool, uint32_t layer, uint32_t part, uint32_t block) {
  return pool.buffer->data() + ((uint64_t{layer} * 2 + part) * kBlocks + block) * kBlockBytes;
}

// Every destination block written (by `moved`: dst block -> src block) equals its source block
// in every layer and part; every other block is all poison. Empty when so, else the first
// difference.
std::string Check(const Pool& src, const Pool& dst, const std::map<uint32_t, uint32_t>& moved) {
  const std::vector<uint8_t> poison(kBlockBytes, kPoison);
  for (uint32_t layer = 0; layer < 2; ++layer) {
    for (uint32_t part = 0; part < 2; ++part) {
      for (uint32_t b = 0; b < kBlocks; ++b) {
        auto it = moved.find(b);
        const uint8_t* want = it == moved.end() ? poison.data() : At(src, layer, part, it->second);
        if (std::memcmp(At(dst, layer, part, b), want, kBlockBytes) != 0) {
          return "layer " + std::to_string(layer) + " part " + std::to_string(part) +
                 " destination block " + std::to_string(b) +
                 (it == moved.end() ? " was written" : " differs from its source block");
        }
      }
    }
  }
  return "";
}

void FillRandom(Pool& pool, uint32_t seed) {
  std::mt19937 rng(seed);
  uint8_t* p = pool.buffer->data();
  for (uint64_t i = 0; i < 2 * 2 * kBlocks * kBlockBytes; ++i) {
    p[i] = static_cast<uint8_t>(rng() % 255);  // never kPoison's pattern by accident
    if (p[i] == kPoison) p[i] = 0;
  }
}

v1::TransferSpec Shape(const Pool& src, const Pool& dst) {
  v1::TransferSpec shape;
  shape.mutable_src()->set_region_id(src.id());
  shape.mutable_dst()->set_region_id(dst.id());
  return shape;
}

// Posts `posts` transfers of 2 blocks each through `prepared`, new scattered ids every time
// (the destination's distinct over all posts), waits for each, and checks the pools.
void PostMany(client::Client& c, client::PreparedTransfer& prepared, const Pool& src,
              const Pool& dst, uint32_t posts, uint32_t seed) {
  const std::vector<uint32_t> dst_order = ScatteredBlocks(kBlocks, 2 * posts, seed);
  std::map<uint32_t, uint32_t> moved;
  std::mt19937 rng(seed);
  for (uint32_t i = 0; i < posts; ++i) {
    const std::vector<uint32_t> s = {static_cast<uint32_t>(rng() % kBlocks),
                                     static_cast<uint32_t>(rng() % kBlocks)};
    const std::vector<uint32_t> d = {dst_order[2 * i], dst_order[2 * i + 1]};
    auto posted = prepared.Post(s, d);
    INFO("post " << i << ": " << posted.status().ToString());
    REQUIRE(posted.ok());
    CHECK(posted->bytes_total() == 2 * 2 * 2 * kBlockBytes);
    auto status = c.Wait(posted->transfer_id(), absl::Seconds(60));
    REQUIRE(status.ok());
    REQUIRE(status->state() == v1::TRANSFER_STATE_SUCCEEDED);
    moved[d[0]] = s[0];
    moved[d[1]] = s[1];
  }
  CHECK(Check(src, dst, moved) == "");
}

}  // namespace

TEST_CASE("a prepared shape posted many times moves exactly each post's blocks") {
  LiveDaemon live;
  Pool src = MakePool(*live.client, Small(), true, "prefill");
  Pool dst = MakePool(*live.client, Small(), true, "decode");
  FillRandom(src, 7);
  auto prepared = live.client->Prepare(Shape(src, dst), 2);
  INFO(prepared.status().ToString());
  REQUIRE(prepared.ok());
  CHECK(prepared->info().src_block_count() == 2);
  CHECK(prepared->info().dst_block_count() == 2);
  const uint64_t queued_before = live.client->SubmissionQueueCounts().first;
  PostMany(*live.client, *prepared, src, dst, 24, 11);
  // Every post was one submission-queue entry (no socket round trip).
  CHECK(live.client->SubmissionQueueCounts().first - queued_before == 24);

  // Refused posts name the field and move nothing.
  const uint64_t before = CountWritten(dst);
  auto bad = prepared->Post({1, kBlocks}, {60, 61});
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(bad.status().message()) ==
        "post.src_block_ids[1]: block 64 out of range [0, 64)");
  bad = prepared->Post({1, 2}, {60});
  CHECK(std::string(bad.status().message()) ==
        "post.dst_block_ids: 1 ids, the prepared transfer takes 2");
  CHECK(CountWritten(dst) == before);

  // Another session's client cannot post it (it looks unknown).
  auto other = client::Client::Connect(live.daemon.socket());
  REQUIRE(other.ok());
  v1::PostTransferRequest theirs;
  theirs.set_prepared_id(prepared->id());
  theirs.add_src_block_ids(1);
  theirs.add_src_block_ids(2);
  theirs.add_dst_block_ids(62);
  theirs.add_dst_block_ids(63);
  auto stolen = (*other)->PostPrepared(theirs);
  CHECK(stolen.status().code() == absl::StatusCode::kNotFound);
  CHECK(std::string(stolen.status().message()) ==
        "prepared_id: no prepared transfer " + std::to_string(prepared->id()));

  // Released on destruction: the id is gone for its owner too.
  const uint64_t id = prepared->id();
  { client::PreparedTransfer gone = *std::move(prepared); }
  theirs.set_prepared_id(id);
  CHECK(live.client->PostPrepared(theirs).status().code() == absl::StatusCode::kNotFound);
  CHECK(CountWritten(dst) == before);
}

TEST_CASE("the client sends a post's ids as varints below 1024 a side, as le32 bytes from 1024") {
  std::vector<uint32_t> few(1023, 7), many(1024, 9);
  const v1::PostTransferRequest small =
      client::MakePostRequest(5, few.data(), few.size(), many.data(), many.size());
  CHECK(small.prepared_id() == 5);
  CHECK(small.src_block_ids_size() == 1023);
  CHECK(small.src_block_ids_le32().empty());
  CHECK(small.dst_block_ids_size() == 0);
  REQUIRE(small.dst_block_ids_le32().size() == 4 * 1024);
  CHECK(std::memcmp(small.dst_block_ids_le32().data(), many.data(), 4 * 1024) == 0);
}

TEST_CASE("posts by POST packets and over gRPC move the same bytes; a gone region ends them") {
  LiveDaemon live;
  {
    ::setenv("KVRAIL_SUBMISSION_QUEUE", "0", 1);
    auto packets = client::Client::Connect(live.daemon.socket());
    ::unsetenv("KVRAIL_SUBMISSION_QUEUE");
    REQUIRE(packets.ok());
    Pool src = MakePool(**packets, Small(), true, "prefill");
    Pool dst = MakePool(**packets, Small(), true, "decode");
    FillRandom(src, 9);
    auto prepared = (*packets)->Prepare(Shape(src, dst), 2);
    REQUIRE(prepared.ok());
    PostMany(**packets, *prepared, src, dst, 8, 13);
    CHECK((*packets)->SubmissionQueueCounts().first == 0);
  }
  ::setenv("KVRAIL_SUBMIT_VIA", "grpc", 1);
  auto grpc_client = client::Client::Connect(live.daemon.socket());
  ::unsetenv("KVRAIL_SUBMIT_VIA");
  REQUIRE(grpc_client.ok());
  client::Client& c = **grpc_client;
  Pool src = MakePool(c, Small(), true, "prefill");
  Pool dst = MakePool(c, Small(), true, "decode");
  FillRandom(src, 3);
  auto prepared = c.Prepare(Shape(src, dst), 2);
  REQUIRE(prepared.ok());
  PostMany(c, *prepared, src, dst, 8, 5);
  REQUIRE(c.UnregisterRegion(dst.id()).ok());
  auto after = prepared->Post({1, 2}, {3, 4});
  CHECK(after.status().code() == absl::StatusCode::kNotFound);
  CHECK(std::string(after.status().message()).rfind("prepared_id: ", 0) == 0);
  CHECK(prepared->Release().ok());  // it ended with its region: released without an error
  CHECK(prepared->id() == 0);
}

}  // namespace kvrail::testing
