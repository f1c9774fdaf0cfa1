// The client's completion table against a producer that stands in for kvraild (the same ring,
// attached through its memfd and eventfd): waits see posted ends, a full ring's overflow makes
// pending transfers unsure (never waited for forever), a bad entry is refused and counted,
// sleeping waiters on many threads all wake, and abandoning the table wakes them.
#include "client/completion_table.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <thread>
#include <vector>

#include "absl/time/clock.h"

namespace kvrail::client {
namespace {

using Outcome = CompletionTable::Outcome;

struct Producer {
  std::unique_ptr<wire::SharedRing> ring;
  explicit Producer(CompletionTable& table) {
    auto attached =
        wire::SharedRing::Attach(UniqueFd(::dup(table.memfd())), UniqueFd(::dup(table.eventfd())),
                                 wire::kCompletionEntryBytes);
    REQUIRE(attached.ok());
    ring = *std::move(attached);
  }
  // What the daemon does: push, or count overflow; wake a sleeping consumer.
  bool Post(uint64_t id, int32_t state = 3) {
    wire::Completion c;
    c.transfer_id = id;
    c.state = state;
    uint8_t entry[wire::kCompletionEntryBytes];
    wire::EncodeCompletion(c, entry);
    const bool pushed = ring->view().TryPush(entry, sizeof(entry)).ok();
    if (!pushed) ring->view().AddOverflow();
    if (!pushed || ring->view().ConsumerSleeps()) ring->Wake();
    return pushed;
  }
};

std::unique_ptr<CompletionTable> Table(uint32_t capacity = 64,
                                       absl::Duration spin = absl::ZeroDuration()) {
  auto table = CompletionTable::Create(capacity, spin);
  REQUIRE(table.ok());
  return *std::move(table);
}

TEST_CASE("a posted end is seen by Wait, Peek and States; unknown ids are not followed") {
  auto table = Table(64, absl::Microseconds(50));
  Producer daemon(*table);
  table->Follow(7, table->OverflowMark());
  table->Follow(8, table->OverflowMark());
  CHECK(table->Follows(7));
  CHECK_FALSE(table->Follows(9));
  CHECK(table->Peek(7).outcome == Outcome::kTimeout);
  REQUIRE(daemon.Post(7));
  const auto seen = table->Wait(7, absl::Now() + absl::Seconds(5));
  REQUIRE(seen.outcome == Outcome::kDone);
  CHECK(seen.completion.transfer_id == 7);
  CHECK(seen.completion.state == 3);
  const uint64_t ids[3] = {7, 8, 9};
  int32_t states[3] = {0, 0, 0};
  table->States(ids, 3, states);
  CHECK(states[0] == 3);  // ended
  CHECK(states[1] == 2);  // followed, not ended: RUNNING
  CHECK(states[2] == 0);  // not followed: the caller asks the daemon
  // A bounded wait for what does not end returns at its deadline.
  const absl::Time t0 = absl::Now();
  CHECK(table->Wait(8, t0 + absl::Milliseconds(30)).outcome == Outcome::kTimeout);
  CHECK(absl::Now() - t0 >= absl::Milliseconds(30));
}

TEST_CASE("an end posted before the submit's answer was followed is not lost") {
  auto table = Table();
  Producer daemon(*table);
  const uint64_t mark = table->OverflowMark();
  REQUIRE(daemon.Post(11));
  // Not followed yet, but kept: the submit's answer may come after the end.
  CHECK(table->Peek(11).outcome == Outcome::kDone);
  table->Follow(11, mark);
  CHECK(table->Follows(11));
  CHECK(table->Wait(11, absl::Now() + absl::Seconds(5)).outcome == Outcome::kDone);
}

TEST_CASE("a full ring makes the pending transfers unsure; the old way resolves them") {
  auto table = Table(8);
  Producer daemon(*table);
  for (uint64_t id = 1; id <= 10; ++id) table->Follow(id, table->OverflowMark());
  int posted = 0;
  for (uint64_t id = 1; id <= 10; ++id) posted += daemon.Post(id) ? 1 : 0;
  CHECK(posted == 8);
  // 9 and 10 missed the ring: their waits return kUnsure instead of sleeping forever.
  CHECK(table->Wait(1, absl::Now() + absl::Seconds(5)).outcome == Outcome::kDone);
  CHECK(table->Wait(10, absl::Now() + absl::Seconds(5)).outcome == Outcome::kUnsure);
  CHECK(table->Wait(9, absl::Now() + absl::Seconds(5)).outcome == Outcome::kUnsure);
  wire::Completion resolved;
  resolved.transfer_id = 9;
  resolved.state = 4;
  table->Resolve(resolved);
  const auto nine = table->Peek(9);
  REQUIRE(nine.outcome == Outcome::kDone);
  CHECK(nine.completion.state == 4);
  // A submit whose end overflowed before it was followed is unsure at once.
  const uint64_t mark = table->OverflowMark();
  for (uint64_t id = 100; id < 120; ++id) daemon.Post(id);
  table->Follow(119, mark);
  CHECK(table->Peek(119).outcome == Outcome::kUnsure);
}

TEST_CASE("while armed, the ids that ended or were missed are handed out once, in order") {
  auto table = Table(8);
  Producer daemon(*table);
  for (uint64_t id = 1; id <= 12; ++id) table->Follow(id, table->OverflowMark());
  uint64_t ids[16];
  REQUIRE(daemon.Post(1));
  CHECK(table->TakeFresh(ids, 16) == 0);  // not armed: nothing collected
  table->SetArmed(true);
  for (uint64_t id = 2; id <= 12; ++id) daemon.Post(id);  // 2..9 fit, 10..12 overflow
  size_t n = table->TakeFresh(ids, 4);
  REQUIRE(n == 4);
  CHECK(ids[0] == 2);
  CHECK(ids[3] == 5);
  n = table->TakeFresh(ids, 16);
  // 6..9 ended; 10, 11, 12 missed (unsure: read them the old way).
  REQUIRE(n == 7);
  CHECK(ids[3] == 9);
  std::vector<uint64_t> missed(ids + 4, ids + 7);
  std::sort(missed.begin(), missed.end());
  CHECK(missed == std::vector<uint64_t>{10, 11, 12});
  CHECK(table->Peek(11).outcome == Outcome::kUnsure);
  CHECK(table->TakeFresh(ids, 16) == 0);
}

TEST_CASE("a bad entry is refused and counted; the ones around it are read") {
  auto table = Table();
  Producer daemon(*table);
  table->Follow(1, table->OverflowMark());
  table->Follow(2, table->OverflowMark());
  REQUIRE(daemon.Post(1));
  uint8_t junk[wire::kCompletionEntryBytes] = {0xFF, 0xFF};
  REQUIRE(daemon.ring->view().TryPush(junk, sizeof(junk)).ok());
  REQUIRE(daemon.Post(2, 5));
  CHECK(table->Wait(2, absl::Now() + absl::Seconds(5)).completion.state == 5);
  CHECK(table->Peek(1).outcome == Outcome::kDone);
  CHECK(table->refused_entries() == 1);
}

TEST_CASE("many sleeping waiters all see their ends; abandoning wakes the rest") {
  auto table = Table(16);  // no spin: every waiter sleeps
  Producer daemon(*table);
  constexpr int kThreads = 8;
  constexpr uint64_t kPerThread = 200;
  for (uint64_t id = 1; id <= kThreads * kPerThread; ++id) table->Follow(id, 0);
  std::atomic<int> done{0};
  std::vector<std::thread> waiters;
  for (int t = 0; t < kThreads; ++t) {
    waiters.emplace_back([&, t] {
      for (uint64_t i = 0; i < kPerThread; ++i) {
        const uint64_t id = 1 + t + i * kThreads;
        if (table->Wait(id, absl::Now() + absl::Seconds(20)).outcome == Outcome::kDone) ++done;
      }
    });
  }
  for (uint64_t id = 1; id <= kThreads * kPerThread;) {
    wire::Completion c;
    c.transfer_id = id;
    c.state = 3;
    uint8_t entry[wire::kCompletionEntryBytes];
    wire::EncodeCompletion(c, entry);
    if (daemon.ring->view().TryPush(entry, sizeof(entry)).ok()) {
      if (daemon.ring->view().ConsumerSleeps()) daemon.ring->Wake();
      ++id;
    } else {
      // Full: a real daemon would count overflow; this producer waits for room instead.
      absl::SleepFor(absl::Microseconds(50));
    }
  }
  for (auto& w : waiters) w.join();
  CHECK(done.load() == kThreads * kPerThread);

  table->Follow(5000, table->OverflowMark());
  std::thread sleeper(
      [&] { CHECK(table->Wait(5000, absl::InfiniteFuture()).outcome == Outcome::kUnsure); });
  absl::SleepFor(absl::Milliseconds(20));
  table->Abandon();
  sleeper.join();
}

TEST_CASE("Drain counts what came also once the remembered ends are at their bound") {
  auto table = Table(1024);
  Producer daemon(*table);
  // More ends than the table remembers: from then on each new one pushes out the oldest, and
  // Drain must still count every end it took. The remembered ends' map never grows (a rehash of
  // every end at once stalled a wait): its capacity is the one it was made with.
  constexpr uint64_t kRemembered = CompletionTable::kRememberedEnds;
  const size_t capacity = table->remembered_capacity();
  CHECK(capacity >= kRemembered + 1);
  uint64_t id = 1;
  size_t drained = 0;
  while (id <= 4 * kRemembered + 2000) {
    size_t posted = 0;
    for (; posted < 1000; ++posted, ++id) REQUIRE(daemon.Post(id));
    const size_t got = table->Drain();
    REQUIRE(got == posted);
    drained += got;
    CHECK(table->remembered_capacity() == capacity);
  }
  REQUIRE(drained == id - 1);
}

}  // namespace
}  // namespace kvrail::client

namespace kvrail::client {
namespace {

// The GPU-written completion: a done word the test stores as the daemon's GPU stream would.
struct Words {
  alignas(8) uint64_t w[4] = {0, 0, 0, 0};
  void Store(uint32_t i, uint64_t v) { __atomic_store_n(&w[i], v, __ATOMIC_RELEASE); }
};

TEST_CASE("done word: SUCCEEDED from the word before the daemon's entry, which then replaces it") {
  auto table = Table(64, absl::Microseconds(50));
  Producer daemon(*table);
  Words words;
  table->EnableDoneWords(words.w, 4, 99);
  auto slot = table->TakeDoneSlot();
  REQUIRE(slot.has_value());
  CHECK(slot->region_id == 99);
  CHECK(slot->value != 0);
  table->Follow(1, table->OverflowMark(), slot, 4096);
  int32_t state = 0;
  table->States(std::vector<uint64_t>{1}.data(), 1, &state);
  CHECK(state == 2);  // running: the word is not there yet
  words.Store(slot->index, slot->value);
  table->States(std::vector<uint64_t>{1}.data(), 1, &state);
  CHECK(state == 3);
  CompletionTable::Result r = table->Peek(1);
  REQUIRE(r.outcome == Outcome::kDone);
  CHECK(r.completion.bytes_done == 4096);
  CHECK(table->word_hits() == 1);
  CHECK(table->free_done_slots() == 4);  // seen: the slot is free again
  // The daemon's entry still comes; it is authoritative and replaces the word's.
  REQUIRE(daemon.Post(1, 3));
  CHECK(table->Wait(1, absl::Now() + absl::Seconds(1)).outcome == Outcome::kDone);
  CHECK(table->word_hits() == 1);
}

TEST_CASE("done word: a stale word never marks a later transfer of the same slot done") {
  auto table = Table(64);
  Producer daemon(*table);
  Words words;
  table->EnableDoneWords(words.w, 1, 5);  // one slot: every transfer reuses it
  // A transfer that succeeded: its word is stored and stays in the slot.
  auto first = table->TakeDoneSlot();
  REQUIRE(first.has_value());
  CHECK_FALSE(table->TakeDoneSlot().has_value());  // none free while it is followed
  table->Follow(1, table->OverflowMark(), first, 8);
  words.Store(first->index, first->value);
  CHECK(table->Peek(1).outcome == Outcome::kDone);
  // A failed transfer on the same slot: the GPU never stores its word; the old value stays.
  auto second = table->TakeDoneSlot();
  REQUIRE(second.has_value());
  CHECK(second->index == first->index);
  CHECK(second->value != first->value);
  table->Follow(2, table->OverflowMark(), second, 8);
  CHECK(table->Peek(2).outcome == Outcome::kTimeout);
  CHECK_FALSE(table->TakeDoneSlot().has_value());  // recycled only after the daemon's end
  REQUIRE(daemon.Post(2, 4));                      // FAILED, from the daemon
  CompletionTable::Result failed = table->Wait(2, absl::Now() + absl::Seconds(1));
  REQUIRE(failed.outcome == Outcome::kDone);
  CHECK(failed.completion.state == 4);
  // A third transfer on the slot, which still holds the first one's value.
  auto third = table->TakeDoneSlot();
  REQUIRE(third.has_value());
  table->Follow(3, table->OverflowMark(), third, 8);
  int32_t state = 0;
  uint64_t id = 3;
  table->States(&id, 1, &state);
  CHECK(state == 2);
  // Garbage the client (or anyone with the mapping) wrote there changes nothing either.
  words.Store(third->index, ~third->value);
  table->States(&id, 1, &state);
  CHECK(state == 2);
  words.Store(third->index, third->value);
  table->States(&id, 1, &state);
  CHECK(state == 3);
}

TEST_CASE("done word: a waiter spinning on the queue sees the word; no slot leaks") {
  auto table = Table(64, absl::Milliseconds(20));
  Words words;
  table->EnableDoneWords(words.w, 4, 1);
  auto slot = table->TakeDoneSlot();
  REQUIRE(slot.has_value());
  table->Follow(7, table->OverflowMark(), slot, 16);
  std::thread gpu([&] {
    absl::SleepFor(absl::Milliseconds(2));
    words.Store(slot->index, slot->value);
  });
  const CompletionTable::Result r = table->Wait(7, absl::Now() + absl::Seconds(5));
  gpu.join();
  CHECK(r.outcome == Outcome::kDone);
  CHECK(r.completion.state == 3);
  CHECK(table->free_done_slots() == 4);
  // A slot given back unused (a refused submit) is free again.
  auto unused = table->TakeDoneSlot();
  REQUIRE(unused.has_value());
  table->ReturnDoneSlot(*unused);
  CHECK(table->free_done_slots() == 4);
}

}  // namespace
}  // namespace kvrail::client
