// The shared-memory ring: entries round trip, wrap around, a full ring refuses (never drops),
// garbage written by the other side is refused entry by entry without harming the reader,
// impossible indices are refused, a producer in another process that dies mid-stream leaves
// what it published readable, and a producer thread and a consumer thread agree (TSan runs it).
#include "wire/shm_ring.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <thread>
#include <vector>

namespace kvrail::wire {
namespace {

Completion Make(uint64_t id) {
  Completion c;
  c.tag = id * 7;
  c.transfer_id = id;
  c.state = 3;  // SUCCEEDED
  c.bytes_total = c.bytes_done = 4096;
  c.finished_unix_us = 1000 + static_cast<int64_t>(id);
  return c;
}

absl::Status Push(RingView& ring, const Completion& c) {
  uint8_t entry[kCompletionEntryBytes];
  EncodeCompletion(c, entry);
  return ring.TryPush(entry, sizeof(entry));
}

// Pops everything; parsed completions into `out`, refusals into `refused`.
absl::StatusOr<size_t> Drain(RingView& ring, std::vector<Completion>* out,
                             std::vector<absl::Status>* refused = nullptr) {
  return ring.Pop(~size_t{0}, [&](const uint8_t* bytes, size_t size) {
    absl::StatusOr<Completion> c = ParseCompletion(bytes, size);
    if (c.ok()) {
      out->push_back(*c);
    } else if (refused != nullptr) {
      refused->push_back(c.status());
    }
  });
}

TEST_CASE("completion entries round trip and bad ones are refused naming the field") {
  uint8_t entry[kCompletionEntryBytes];
  Completion c = Make(42);
  c.state = 4;  // FAILED
  c.error_code = 3;
  EncodeCompletion(c, entry);
  absl::StatusOr<Completion> back = ParseCompletion(entry, sizeof(entry));
  REQUIRE(back.ok());
  CHECK(back->transfer_id == 42);
  CHECK(back->tag == 42 * 7);
  CHECK(back->state == 4);
  CHECK(back->error_code == 3);
  CHECK(back->bytes_done == 4096);
  CHECK(back->finished_unix_us == 1042);

  CHECK(absl::IsInvalidArgument(ParseCompletion(entry, 10).status()));
  auto refused = [&](size_t offset, const void* value, size_t n, const char* field) {
    uint8_t bad[kCompletionEntryBytes];
    std::memcpy(bad, entry, sizeof(bad));
    std::memcpy(bad + offset, value, n);
    absl::Status status = ParseCompletion(bad, sizeof(bad)).status();
    INFO(status.ToString());
    CHECK(absl::IsInvalidArgument(status));
    CHECK(std::string(status.message()).find(field) != std::string::npos);
  };
  const uint16_t kind = 9, size = 48;
  const uint64_t zero = 0;
  const int32_t running = 2, code = 99;  // RUNNING is not final
  refused(0, &kind, 2, "completion.kind");
  refused(2, &size, 2, "completion.entry_bytes");
  refused(16, &zero, 8, "completion.transfer_id");
  refused(24, &running, 4, "completion.state");
  refused(28, &code, 4, "completion.error_code");
}

TEST_CASE("a ring's header is checked when the other side opens it") {
  std::vector<uint8_t> memory(RingBytes(16, kCompletionEntryBytes));
  CHECK(absl::IsInvalidArgument(RingView::Format(memory.data(), memory.size(), 12, 64).status()));
  CHECK(absl::IsInvalidArgument(RingView::Format(memory.data(), 100, 16, 64).status()));
  REQUIRE(RingView::Format(memory.data(), memory.size(), 16, kCompletionEntryBytes).ok());
  CHECK(RingView::Open(memory.data(), memory.size(), kCompletionEntryBytes).ok());
  // Another slot size, a size that does not match the capacity, a bad capacity.
  CHECK(absl::IsInvalidArgument(RingView::Open(memory.data(), memory.size(), 32).status()));
  CHECK(absl::IsInvalidArgument(RingView::Open(memory.data(), memory.size() - 64, 64).status()));
  const uint32_t bad_capacity = 24;
  std::memcpy(memory.data() + 12, &bad_capacity, 4);
  absl::Status status = RingView::Open(memory.data(), memory.size(), 64).status();
  CHECK(std::string(status.message()).find("ring.capacity") != std::string::npos);
  std::memset(memory.data(), 0, 4);
  CHECK(std::string(RingView::Open(memory.data(), memory.size(), 64).status().message())
            .find("ring.magic") != std::string::npos);
}

TEST_CASE("entries wrap around the ring many times in order") {
  std::vector<uint8_t> memory(RingBytes(8, kCompletionEntryBytes));
  RingView producer = *RingView::Format(memory.data(), memory.size(), 8, kCompletionEntryBytes);
  RingView consumer = *RingView::Open(memory.data(), memory.size(), kCompletionEntryBytes);
  uint64_t next = 1, expected = 1;
  for (int round = 0; round < 100; ++round) {
    const int burst = 1 + round % 8;
    for (int i = 0; i < burst; ++i) REQUIRE(Push(producer, Make(next++)).ok());
    std::vector<Completion> got;
    REQUIRE(*Drain(consumer, &got) == static_cast<size_t>(burst));
    for (const Completion& c : got) CHECK(c.transfer_id == expected++);
  }
  CHECK(consumer.head() == next - 1);
}

TEST_CASE("a full ring refuses the entry (the producer falls back) and takes it once drained") {
  std::vector<uint8_t> memory(RingBytes(8, kCompletionEntryBytes));
  RingView producer = *RingView::Format(memory.data(), memory.size(), 8, kCompletionEntryBytes);
  RingView consumer = *RingView::Open(memory.data(), memory.size(), kCompletionEntryBytes);
  for (uint64_t id = 1; id <= 8; ++id) REQUIRE(Push(producer, Make(id)).ok());
  absl::Status full = Push(producer, Make(9));
  CHECK(absl::IsResourceExhausted(full));
  producer.AddOverflow();
  CHECK(consumer.overflow() == 1);
  // Nothing was overwritten: the eight are intact, in order.
  std::vector<Completion> got;
  REQUIRE(*Drain(consumer, &got) == 8);
  for (uint64_t i = 0; i < 8; ++i) CHECK(got[i].transfer_id == i + 1);
  REQUIRE(Push(producer, Make(9)).ok());
  got.clear();
  REQUIRE(*Drain(consumer, &got) == 1);
  CHECK(got[0].transfer_id == 9);
}

TEST_CASE("garbage entries are refused one by one; the entries around them are read") {
  std::vector<uint8_t> memory(RingBytes(16, kCompletionEntryBytes));
  RingView producer = *RingView::Format(memory.data(), memory.size(), 16, kCompletionEntryBytes);
  RingView consumer = *RingView::Open(memory.data(), memory.size(), kCompletionEntryBytes);
  REQUIRE(Push(producer, Make(1)).ok());
  uint8_t junk[kCompletionEntryBytes];
  for (size_t i = 0; i < sizeof(junk); ++i) junk[i] = static_cast<uint8_t>(0xA5 ^ i);
  REQUIRE(producer.TryPush(junk, sizeof(junk)).ok());
  uint8_t short_entry[8] = {1, 0, 8, 0};
  REQUIRE(producer.TryPush(short_entry, sizeof(short_entry)).ok());  // zero-padded: refused
  CHECK(absl::IsInvalidArgument(producer.TryPush(junk, 4096)));      // larger than a slot
  REQUIRE(Push(producer, Make(2)).ok());
  std::vector<Completion> got;
  std::vector<absl::Status> refused;
  REQUIRE(*Drain(consumer, &got, &refused) == 4);
  REQUIRE(got.size() == 2);
  CHECK(got[0].transfer_id == 1);
  CHECK(got[1].transfer_id == 2);
  CHECK(refused.size() == 2);
}

TEST_CASE("impossible indices written by the other side are refused; nothing is read or written") {
  std::vector<uint8_t> memory(RingBytes(8, kCompletionEntryBytes));
  RingView producer = *RingView::Format(memory.data(), memory.size(), 8, kCompletionEntryBytes);
  RingView consumer = *RingView::Open(memory.data(), memory.size(), kCompletionEntryBytes);
  REQUIRE(Push(producer, Make(1)).ok());
  std::vector<uint8_t> before = memory;
  // A consumer that writes a head ahead of the tail: the producer refuses to write.
  const uint64_t bogus_head = 1000;
  std::memcpy(memory.data() + 128, &bogus_head, 8);
  CHECK(absl::IsDataLoss(Push(producer, Make(2))));
  // A producer that writes a tail far ahead of the head: the consumer refuses to read.
  std::memcpy(memory.data() + 128, &before[128], 8);
  const uint64_t bogus_tail = 1u << 30;
  std::memcpy(memory.data() + 64, &bogus_tail, 8);
  std::vector<Completion> got;
  absl::StatusOr<size_t> taken = Drain(consumer, &got);
  CHECK(absl::IsDataLoss(taken.status()));
  CHECK(got.empty());
  CHECK(consumer.head() == 0);
  // A tail behind the head (wrapping) is as impossible.
  const uint64_t behind = ~uint64_t{0};
  std::memcpy(memory.data() + 64, &behind, 8);
  CHECK(absl::IsDataLoss(Drain(consumer, &got).status()));
  // Restored, the ring reads on as before.
  std::memcpy(memory.data() + 64, &before[64], 8);
  REQUIRE(*Drain(consumer, &got) == 1);
  CHECK(got[0].transfer_id == 1);
}

TEST_CASE("a producer process that dies with entries in flight leaves its published ones") {
  absl::StatusOr<std::unique_ptr<SharedRing>> ring = SharedRing::Create(64, kCompletionEntryBytes);
  REQUIRE(ring.ok());
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // The child attaches its own mapping, as kvraild does, posts 10 entries, half-writes an
    // 11th slot without publishing it, and dies.
    absl::StatusOr<std::unique_ptr<SharedRing>> attached =
        SharedRing::Attach(UniqueFd(::dup((*ring)->memfd())), UniqueFd(::dup((*ring)->eventfd())),
                           kCompletionEntryBytes);
    if (!attached.ok()) ::_exit(2);
    for (uint64_t id = 1; id <= 10; ++id) {
      uint8_t entry[kCompletionEntryBytes];
      EncodeCompletion(Make(id), entry);
      if (!(*attached)->view().TryPush(entry, sizeof(entry)).ok()) ::_exit(3);
    }
    (*attached)->Wake();
    ::_exit(9);  // "killed" mid-stream
  }
  int wstatus = 0;
  REQUIRE(::waitpid(child, &wstatus, 0) == child);
  REQUIRE(WIFEXITED(wstatus));
  REQUIRE(WEXITSTATUS(wstatus) == 9);
  pollfd p{(*ring)->eventfd(), POLLIN, 0};
  CHECK(::poll(&p, 1, 0) == 1);  // the wake-up arrived
  (*ring)->DrainWakes();
  CHECK(::poll(&p, 1, 0) == 0);
  std::vector<Completion> got;
  REQUIRE(*Drain((*ring)->view(), &got) == 10);
  CHECK(got.back().transfer_id == 10);
  CHECK_FALSE((*ring)->view().Ready());
}

TEST_CASE("attach refuses what is not a sealed ring memfd or not an eventfd") {
  absl::StatusOr<std::unique_ptr<SharedRing>> ring = SharedRing::Create(16, kCompletionEntryBytes);
  REQUIRE(ring.ok());
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  UniqueFd pipe_read(pipe_fds[0]), pipe_write(pipe_fds[1]);
  absl::Status status = SharedRing::Attach(UniqueFd(::dup((*ring)->memfd())),
                                           UniqueFd(::dup(pipe_read.get())), kCompletionEntryBytes)
                            .status();
  CHECK(std::string(status.message()).find("ring eventfd") != std::string::npos);
  // A memfd that cannot be sealed (made without MFD_ALLOW_SEALING) could be truncated under us.
  UniqueFd unsealable(::memfd_create("t", MFD_CLOEXEC));
  REQUIRE(::ftruncate(unsealable.get(), static_cast<off_t>(RingBytes(16, 64))) == 0);
  status = SharedRing::Attach(std::move(unsealable), UniqueFd(::dup((*ring)->eventfd())),
                              kCompletionEntryBytes)
               .status();
  CHECK(std::string(status.message()).find("ring memfd") != std::string::npos);
  CHECK(SharedRing::Attach(UniqueFd(::dup((*ring)->memfd())), UniqueFd(::dup((*ring)->eventfd())),
                           kCompletionEntryBytes)
            .ok());
}

TEST_CASE("a producer thread and a sleeping consumer thread agree on every entry") {
  absl::StatusOr<std::unique_ptr<SharedRing>> ring = SharedRing::Create(64, kCompletionEntryBytes);
  REQUIRE(ring.ok());
  absl::StatusOr<std::unique_ptr<SharedRing>> producer_side =
      SharedRing::Attach(UniqueFd(::dup((*ring)->memfd())), UniqueFd(::dup((*ring)->eventfd())),
                         kCompletionEntryBytes);
  REQUIRE(producer_side.ok());
  constexpr uint64_t kCount = 20000;
  std::thread producer([&] {
    RingView& view = (*producer_side)->view();
    for (uint64_t id = 1; id <= kCount;) {
      if (Push(view, Make(id)).ok()) {
        ++id;
        if (view.ConsumerSleeps()) (*producer_side)->Wake();
      } else {
        std::this_thread::yield();
      }
    }
  });
  uint64_t expected = 1;
  RingView& view = (*ring)->view();
  while (expected <= kCount) {
    std::vector<Completion> got;
    REQUIRE(Drain(view, &got).ok());
    for (const Completion& c : got) REQUIRE(c.transfer_id == expected++);
    if (!got.empty()) continue;
    // Sleep protocol: announce, look once more, then sleep on the eventfd.
    view.SetNeedWake(true);
    if (!view.Ready()) {
      pollfd p{(*ring)->eventfd(), POLLIN, 0};
      REQUIRE(::poll(&p, 1, 10000) == 1);  // a lost wake-up would hang here
      (*ring)->DrainWakes();
    }
    view.SetNeedWake(false);
  }
  producer.join();
  CHECK(expected == kCount + 1);
}

}  // namespace
}  // namespace kvrail::wire
