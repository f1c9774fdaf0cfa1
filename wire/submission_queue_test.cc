// Submission queue entries: multi-slot entries round trip through a ring and across its wrap,
// a batch is published at once or not at all, a full ring refuses (the caller falls back), a
// request too big for an entry is refused before it is written, and garbage the other side
// wrote is refused entry by entry naming the field, the entries after it still read.
#include "wire/submission_queue.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "wire/shm_ring.h"

namespace kvrail::wire {
namespace {

struct Ring {
  explicit Ring(uint32_t capacity)
      : memory(RingBytes(capacity, kSubmissionSlotBytes), 0),
        producer(*RingView::Format(memory.data(), memory.size(), capacity, kSubmissionSlotBytes)),
        consumer(*RingView::Open(memory.data(), memory.size(), kSubmissionSlotBytes)) {}
  std::vector<uint8_t> memory;
  RingView producer;
  RingView consumer;
};

struct Taken {
  uint64_t tag = 0;
  absl::StatusOr<std::string> payload;
};

// Reads every published entry the way the daemon does: the header, then its span.
std::vector<Taken> Consume(RingView& ring) {
  std::vector<Taken> out;
  for (;;) {
    absl::StatusOr<uint64_t> published = ring.Published();
    REQUIRE(published.ok());
    if (*published == 0) return out;
    std::string entry;
    SubmissionHeader header;
    REQUIRE(*ring.Pop(1, [&](const uint8_t* slot, size_t n) {
      header = ReadSubmissionHeader(slot);
      entry.assign(reinterpret_cast<const char*>(slot), n);
    }) == 1);
    const uint32_t span = SubmissionSpan(header, *published);
    REQUIRE(*ring.Pop(span - 1, [&](const uint8_t* slot, size_t n) {
      entry.append(reinterpret_cast<const char*>(slot), n);
    }) == span - 1);
    absl::StatusOr<absl::string_view> payload =
        SubmissionPayload(reinterpret_cast<const uint8_t*>(entry.data()), entry.size());
    Taken t;
    t.tag = header.tag;
    t.payload = payload.ok() ? absl::StatusOr<std::string>(std::string(*payload))
                             : absl::StatusOr<std::string>(payload.status());
    out.push_back(std::move(t));
  }
}

std::string Payload(size_t n, char c) { return std::string(n, c); }

absl::Status PushBatch(RingView& ring, const std::vector<std::pair<uint64_t, std::string>>& in) {
  std::string bytes;
  for (const auto& [tag, payload] : in) {
    absl::Status appended = AppendSubmission(tag, payload, &bytes);
    if (!appended.ok()) return appended;
  }
  return ring.TryPushSlots(reinterpret_cast<const uint8_t*>(bytes.data()),
                           bytes.size() / kSubmissionSlotBytes);
}

TEST_CASE("entry sizes: one slot holds 48 payload bytes, the largest entry 4080") {
  CHECK(SubmissionSlots(0) == 1);
  CHECK(SubmissionSlots(48) == 1);
  CHECK(SubmissionSlots(49) == 2);
  CHECK(SubmissionSlots(kMaxSubmissionPayload) == kMaxSubmissionSlots);
  CHECK(SubmissionSlots(kMaxSubmissionPayload + 1) == 0);
  std::string out;
  absl::Status too_big = AppendSubmission(1, Payload(kMaxSubmissionPayload + 1, 'x'), &out);
  CHECK(absl::IsInvalidArgument(too_big));
  CHECK(absl::StrContains(too_big.message(), "sq.entry.payload_bytes"));
  CHECK(out.empty());
}

TEST_CASE("a batch of multi-slot entries round trips in one publish, across the wrap") {
  Ring ring(64);
  for (int round = 0; round < 20; ++round) {
    // 3 entries of 1, 3 and 5 slots: the ring wraps every few rounds, mid-entry too.
    const std::vector<std::pair<uint64_t, std::string>> batch = {
        {uint64_t(round) * 3 + 1, Payload(10, 'a' + round % 20)},
        {uint64_t(round) * 3 + 2, Payload(150, 'K')},
        {uint64_t(round) * 3 + 3, Payload(300, 'V')}};
    REQUIRE(PushBatch(ring.producer, batch).ok());
    std::vector<Taken> taken = Consume(ring.consumer);
    REQUIRE(taken.size() == 3);
    for (size_t i = 0; i < 3; ++i) {
      CHECK(taken[i].tag == batch[i].first);
      REQUIRE(taken[i].payload.ok());
      CHECK(*taken[i].payload == batch[i].second);
    }
  }
}

TEST_CASE("a full ring refuses the whole batch and writes nothing of it") {
  Ring ring(16);
  REQUIRE(PushBatch(ring.producer, {{1, Payload(700, 'a')}}).ok());  // 12 slots
  absl::Status full = PushBatch(ring.producer, {{2, Payload(100, 'b')}, {3, Payload(400, 'c')}});
  CHECK(absl::IsResourceExhausted(full));  // 2 + 7 > 4 free
  std::vector<Taken> taken = Consume(ring.consumer);
  REQUIRE(taken.size() == 1);
  CHECK(taken[0].tag == 1);
  // Room again once read.
  CHECK(PushBatch(ring.producer, {{2, Payload(100, 'b')}, {3, Payload(400, 'c')}}).ok());
  CHECK(Consume(ring.consumer).size() == 2);
}

TEST_CASE("garbage entries are refused one by one naming the field; later entries still read") {
  Ring ring(64);
  std::string bytes;
  REQUIRE(AppendSubmission(1, Payload(20, 'a'), &bytes).ok());
  // A slot of the wrong kind.
  std::string bad_kind(kSubmissionSlotBytes, '\0');
  bad_kind[0] = 9;
  bad_kind[8] = 2;  // tag 2
  bytes += bad_kind;
  // A header claiming more slots than were ever published is refused alone (1 slot).
  std::string bad_slots;
  REQUIRE(AppendSubmission(3, Payload(20, 'c'), &bad_slots).ok());
  bad_slots[2] = 60;
  // payload_bytes that does not match its slots.
  std::string bad_size;
  REQUIRE(AppendSubmission(4, Payload(100, 'd'), &bad_size).ok());  // 2 slots
  bad_size[4] = 10;
  bytes += bad_size;
  bytes += bad_slots;  // last: 60 slots are not published behind it
  REQUIRE(AppendSubmission(5, Payload(20, 'e'), &bytes).ok());
  REQUIRE(ring.producer
              .TryPushSlots(reinterpret_cast<const uint8_t*>(bytes.data()),
                            bytes.size() / kSubmissionSlotBytes)
              .ok());
  std::vector<Taken> taken = Consume(ring.consumer);
  REQUIRE(taken.size() == 5);
  CHECK(taken[0].payload.ok());
  CHECK(taken[1].tag == 2);
  CHECK(absl::StrContains(taken[1].payload.status().message(), "sq.entry.kind"));
  CHECK(taken[2].tag == 4);
  CHECK(absl::StrContains(taken[2].payload.status().message(), "sq.entry.payload_bytes"));
  CHECK(taken[3].tag == 3);
  CHECK(absl::StrContains(taken[3].payload.status().message(), "sq.entry.slots"));
  CHECK(taken[4].tag == 5);
  REQUIRE(taken[4].payload.ok());
  CHECK(*taken[4].payload == Payload(20, 'e'));
}

TEST_CASE("a post entry (kPostKind) is read with its kind; an unknown kind is refused alone") {
  std::string bytes;
  REQUIRE(AppendSubmission(6, Payload(100, 'p'), &bytes, kPostKind).ok());  // 2 slots
  const SubmissionHeader h = ReadSubmissionHeader(reinterpret_cast<const uint8_t*>(bytes.data()));
  CHECK(h.kind == kPostKind);
  CHECK(h.tag == 6);
  CHECK(SubmissionSpan(h, 8) == 2);
  auto payload = SubmissionPayload(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  REQUIRE(payload.ok());
  CHECK(*payload == Payload(100, 'p'));
  bytes[0] = 5;  // neither a submit nor a post
  const SubmissionHeader bad = ReadSubmissionHeader(reinterpret_cast<const uint8_t*>(bytes.data()));
  CHECK(SubmissionSpan(bad, 8) == 1);
  CHECK(SubmissionPayload(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size())
            .status()
            .message() == "sq.entry.kind: 5, expected 2 or 4");
}

TEST_CASE("acknowledgements round trip; a long message is cut and flagged; bad ones refused") {
  uint8_t entry[kSubmitAckBytes];
  SubmitAck ack;
  ack.tag = 7;
  ack.transfer_id = 99;
  ack.bytes_total = 4096;
  ack.tiles_total = 1;
  ack.flags = kSubmitAckDeduplicated;
  EncodeSubmitAck(ack, entry);
  absl::StatusOr<SubmitAck> back = ParseSubmitAck(entry, sizeof(entry));
  REQUIRE(back.ok());
  CHECK(back->tag == 7);
  CHECK(back->transfer_id == 99);
  CHECK(back->bytes_total == 4096);
  CHECK(back->tiles_total == 1);
  CHECK(back->flags == kSubmitAckDeduplicated);
  CHECK(SubmitAckStatus(*back).ok());

  SubmitAck refused;
  refused.tag = 8;
  refused.code = static_cast<int32_t>(absl::StatusCode::kInvalidArgument);
  refused.message =
      "spec.src.region_id: 12 is not a region of this daemon " + std::string(600, '.');
  EncodeSubmitAck(refused, entry);
  back = ParseSubmitAck(entry, sizeof(entry));
  REQUIRE(back.ok());
  CHECK((back->flags & kSubmitAckTruncated) != 0);
  const absl::Status status = SubmitAckStatus(*back);
  CHECK(absl::IsInvalidArgument(status));
  CHECK(absl::StartsWith(status.message(), "spec.src.region_id: 12"));

  EncodeSubmitAck(ack, entry);
  entry[16] = 0;  // transfer id 0 with code 0
  CHECK(absl::StrContains(ParseSubmitAck(entry, sizeof(entry)).status().message(),
                          "sq_ack.transfer_id"));
  EncodeSubmitAck(ack, entry);
  entry[36] = 40;
  CHECK(absl::StrContains(ParseSubmitAck(entry, sizeof(entry)).status().message(), "sq_ack.code"));
  EncodeSubmitAck(ack, entry);
  entry[40] = 0xff;
  entry[41] = 0x7f;
  CHECK(absl::StrContains(ParseSubmitAck(entry, sizeof(entry)).status().message(),
                          "sq_ack.message_bytes"));
  EncodeSubmitAck(ack, entry);
  entry[0] = 1;
  CHECK(absl::StrContains(ParseSubmitAck(entry, sizeof(entry)).status().message(), "sq_ack.kind"));
  CHECK(!ParseSubmitAck(entry, 10).ok());
}

}  // namespace
}  // namespace kvrail::wire
