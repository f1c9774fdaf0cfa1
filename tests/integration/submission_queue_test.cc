// The client's submission queue against a live kvraild: Submit and SubmitBatch go through it and
// move the same bytes as SUBMIT packets; a request too big for an entry, and a batch larger than
// the queue can hold in flight, go by packets for the rest (nothing dropped, every transfer
// moved); a bad spec gets the packet path's code and field; KVRAIL_SUBMISSION_QUEUE=0 keeps the
// client on packets.
#include <catch2/catch.hpp>
#include <cstdlib>

#include "absl/strings/match.h"
#include "tests/integration/kv_fixture.h"

namespace kvrail::testing {
namespace {

v1::PagedKvLayout Small() {
  return MakeLayout(2, 2, 64, 16, 2, 8, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
}

std::unique_ptr<client::Client> ClientWith(const LiveDaemon& live, const char* name,
                                           const char* value) {
  ::setenv(name, value, 1);
  auto c = client::Client::Connect(live.daemon.socket());
  ::unsetenv(name);
  REQUIRE(c.ok());
  return *std::move(c);
}

}  // namespace

TEST_CASE("Submit and SubmitBatch go through the submission queue and move the bytes") {
  LiveDaemon live;
  Pool src = MakePool(*live.client, Small(), false, "prefill");
  Pool dst = MakePool(*live.client, Small(), true, "decode");
  FillPool(src, 3, {1, 2, 3, 4}, 64);
  const v1::TransferStatus one =
      RunToEnd(*live.client, client::MakeBlockTransfer(src.id(), {1}, dst.id(), {10}));
  CHECK(one.state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(live.client->SubmissionQueueCounts() == std::pair<uint64_t, uint64_t>{1, 0});
  // K, V and aux of a chunk as one write; the second is refused on its own.
  std::vector<v1::TransferSpec> specs = {
      client::MakeBlockTransfer(src.id(), {2}, dst.id(), {11}),
      client::MakeBlockTransfer(src.id(), {3}, 999999, {12}),
      client::MakeBlockTransfer(src.id(), {3, 4}, dst.id(), {12, 13})};
  auto results = live.client->SubmitBatch(specs);
  REQUIRE(results.size() == 3);
  REQUIRE(results[0].ok());
  CHECK(results[1].status().code() == absl::StatusCode::kNotFound);
  CHECK(absl::StrContains(results[1].status().message(), "spec.dst.region_id"));
  REQUIRE(results[2].ok());
  CHECK(live.client->SubmissionQueueCounts() == std::pair<uint64_t, uint64_t>{4, 0});
  for (size_t i : {0, 2}) {
    auto done = live.client->Wait(results[i]->transfer_id(), absl::Seconds(60));
    REQUIRE(done.ok());
    CHECK(done->state() == v1::TRANSFER_STATE_SUCCEEDED);
  }
  Expectation e;
  e.seed = 3;
  e.dst_blocks = {10, 11, 12, 13};
  e.tokens = 64;
  e.num_layers = 2;
  e.num_heads = 2;
  CHECK(VerifyPool(dst, e) == "");
  CHECK(live.client->SubmissionQueueCounts() == std::pair<uint64_t, uint64_t>{4, 0});
}

TEST_CASE("WaitEnd reads the end from the completion queue; Wait keeps the whole status") {
  LiveDaemon live;
  Pool src = MakePool(*live.client, Small(), false, "prefill");
  Pool dst = MakePool(*live.client, Small(), true, "decode");
  FillPool(src, 5, {1}, 16);
  auto submitted = live.client->Submit(client::MakeBlockTransfer(src.id(), {1}, dst.id(), {20}));
  REQUIRE(submitted.ok());
  auto end = live.client->WaitEnd(submitted->transfer_id(), absl::Seconds(60));
  REQUIRE(end.ok());
  CHECK(end->state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(end->transfer_id() == submitted->transfer_id());
  CHECK(end->bytes_done() == submitted->bytes_total());
  CHECK(end->finished_unix_us() > 0);
  // Only the queue's entry: the daemon's whole status would name the path.
  CHECK(end->path() == v1::PATH_UNSPECIFIED);
  auto whole = live.client->Wait(submitted->transfer_id(), absl::Seconds(60));
  REQUIRE(whole.ok());
  CHECK(whole->path() == v1::PATH_HOST_LOCAL);
  CHECK(whole->finished_unix_us() == end->finished_unix_us());
  // An id the queue does not follow is the daemon's to answer.
  auto unknown = live.client->WaitEnd(987654321, absl::Seconds(5));
  INFO(unknown.status().ToString());
  CHECK_FALSE(unknown.ok());
  Expectation e;
  e.seed = 5;
  e.dst_blocks = {20};
  e.tokens = 16;
  e.num_layers = 2;
  e.num_heads = 2;
  CHECK(VerifyPool(dst, e) == "");
}

TEST_CASE("KVRAIL_SUBMISSION_QUEUE=0: packets, with the same answers") {
  LiveDaemon live;
  auto packets = ClientWith(live, "KVRAIL_SUBMISSION_QUEUE", "0");
  Pool src = MakePool(*packets, Small(), false);
  Pool dst = MakePool(*packets, Small(), true);
  const v1::TransferSpec bad = client::MakeBlockTransfer(src.id(), {3}, 999999, {12});
  auto by_packet = packets->Submit(bad);
  CHECK(RunToEnd(*packets, client::MakeBlockTransfer(src.id(), {1}, dst.id(), {2})).state() ==
        v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(packets->SubmissionQueueCounts() == std::pair<uint64_t, uint64_t>{0, 0});
  // The queue's refusal of the same spec: the same code and message.
  Pool src2 = MakePool(*live.client, Small(), false);
  auto by_queue = live.client->Submit(client::MakeBlockTransfer(src2.id(), {3}, 999999, {12}));
  CHECK(live.client->SubmissionQueueCounts().first == 1);
  CHECK(by_packet.status().code() == by_queue.status().code());
  CHECK(by_packet.status().message() == by_queue.status().message());
}

TEST_CASE("too big for an entry, or beyond the queue's room: by packet, nothing dropped") {
  LiveDaemon live;
  // The smallest queue: 128 slots, 32 requests in flight.
  auto c = ClientWith(live, "KVRAIL_SUBMISSION_QUEUE_SLOTS", "128");
  Pool src = MakePool(*c, Small(), false);
  Pool dst = MakePool(*c, Small(), true);
  FillPool(src, 5, {0, 1, 2, 3}, 64);
  v1::TransferSpec big = client::MakeBlockTransfer(src.id(), {0}, dst.id(), {20});
  big.set_label(std::string(5000, 'x'));  // larger than an entry's 4080 bytes
  CHECK(RunToEnd(*c, big).state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(c->SubmissionQueueCounts() == std::pair<uint64_t, uint64_t>{0, 1});
  std::vector<v1::TransferSpec> specs;
  for (uint32_t i = 0; i < 100; ++i) {
    specs.push_back(client::MakeBlockTransfer(src.id(), {i % 4}, dst.id(), {30 + i % 34}));
  }
  auto results = c->SubmitBatch(specs);
  const auto [queued, handed_back] = c->SubmissionQueueCounts();
  // 32 through the queue, the other 68 by packets at once.
  CHECK(queued == 32);
  CHECK(handed_back == 1 + 68);
  for (const auto& r : results) {
    REQUIRE(r.ok());
    auto done = c->Wait(r->transfer_id(), absl::Seconds(60));
    REQUIRE(done.ok());
    CHECK(done->state() == v1::TRANSFER_STATE_SUCCEEDED);
  }
  CHECK(CountWritten(dst) > 0);
}

}  // namespace kvrail::testing
