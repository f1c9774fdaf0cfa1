// Internal to the session server: what the threads that end transfers share with it - a
// session's completion queue (CompletionSink) and the per-uid count of pending WAITs
// (PendingWaits). Each class states its thread contract.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "proto/kvrail/v1/transfer.pb.h"
#include "spdlog/spdlog.h"
#include "wire/shm_ring.h"

namespace kvrail::session {

// The producer's end of a ring the client consumes (the completion queue, the submission
// queue's acknowledgements), shared by the daemon's threads. An entry that does not fit - the
// ring is full, or the client broke its indices (DATA_LOSS: nothing is pushed into it again) - is
// counted in the ring's overflow word, and the eventfd rings: the client's fallback (the daemon
// keeps the records) takes over. The first of each is logged with `what` and `fallback`.
// Thread contract: thread-safe; mu_ serialises the producers (the ring has one). The ring's
// descriptors are immutable.
class RingProducer {
 public:
  RingProducer(std::unique_ptr<wire::SharedRing> ring, std::string what, std::string fallback)
      : what_(std::move(what)), fallback_(std::move(fallback)), ring_(std::move(ring)) {}

  int memfd() const ABSL_NO_THREAD_SAFETY_ANALYSIS { return ring_->memfd(); }
  int eventfd() const ABSL_NO_THREAD_SAFETY_ANALYSIS { return ring_->eventfd(); }

  // Pushes one entry (`size` <= the ring's slot bytes) and rings the eventfd when the consumer
  // sleeps. False when it was counted in overflow instead.
  bool Post(const uint8_t* entry, size_t size) {
    absl::MutexLock lock(&mu_);
    const absl::Status pushed =
        broken_ ? absl::DataLossError("broken") : ring_->view().TryPush(entry, size);
    if (pushed.ok()) {
      if (ring_->view().ConsumerSleeps()) ring_->Wake();
      return true;
    }
    if (absl::IsDataLoss(pushed) && !broken_) {
      broken_ = true;
      spdlog::warn("{}: {}; {}", what_, std::string(pushed.message()), fallback_);
    } else if (lost_ == 0 && !broken_) {
      spdlog::warn("{}: an entry did not fit ({}); {}", what_, std::string(pushed.message()),
                   fallback_);
    }
    ++lost_;
    ring_->view().AddOverflow();
    ring_->Wake();
    return false;
  }

  // Tells the client that an entry will not come (counted in overflow, eventfd rung).
  void Missed() {
    absl::MutexLock lock(&mu_);
    ring_->view().AddOverflow();
    ring_->Wake();
  }

 private:
  const std::string what_;
  const std::string fallback_;
  absl::Mutex mu_;
  const std::unique_ptr<wire::SharedRing> ring_ ABSL_PT_GUARDED_BY(mu_);
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t lost_ ABSL_GUARDED_BY(mu_) = 0;
};

// A session's completion queue, daemon side: the threads that end its transfers post their
// final states here. A full ring, or one the client broke, counts the entry in the ring's
// overflow word and rings the eventfd: the client then reads those transfers' states the old
// way (the daemon keeps their records).
// Thread contract: thread-safe (RingProducer's).
class CompletionSink {
 public:
  explicit CompletionSink(std::unique_ptr<wire::SharedRing> ring)
      : ring_(std::move(ring), "completion queue",
              "the session's completions go by packets from now on") {}

  // The ring's descriptors (a hot restart hands duplicates over).
  int memfd() const { return ring_.memfd(); }
  int eventfd() const { return ring_.eventfd(); }

  void Post(const v1::TransferStatus& status, uint64_t tag = 0) {
    wire::Completion c;
    c.tag = tag;
    c.flags = status.has_digest() || !status.error_message().empty() ? wire::kCompletionHasMore : 0;
    c.transfer_id = status.transfer_id();
    c.state = static_cast<int32_t>(status.state());
    c.error_code = status.error_code();
    c.bytes_total = status.bytes_total();
    c.bytes_done = status.bytes_done();
    c.finished_unix_us = status.finished_unix_us();
    uint8_t entry[wire::kCompletionEntryBytes];
    wire::EncodeCompletion(c, entry);
    (void)ring_.Post(entry, sizeof(entry));
  }

  // Tells the client that a transfer's completion will not come through the ring.
  void Missed() { ring_.Missed(); }

 private:
  RingProducer ring_;
};

// WAITs pending per uid (SessionServerOptions::max_waits_per_uid). Shared with the `done`
// callbacks registered for them, which give their place back when their transfer ends, whichever
// thread ends it and whether or not the connection is still open. Thread-safe.
class PendingWaits {
 public:
  explicit PendingWaits(size_t max_per_uid) : max_per_uid_(max_per_uid) {}
  // Takes a place for `uid`, or RESOURCE_EXHAUSTED naming max_watchers_per_uid.
  absl::Status Take(uint32_t uid) {
    absl::MutexLock lock(&mu_);
    size_t& n = per_uid_[uid];
    if (n >= max_per_uid_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "max_watchers_per_uid: uid ", uid, " has ", n,
          " WAITs pending on the session socket, the most allowed "
          "(DaemonConfig.max_watchers_per_uid; a WAIT counts until its transfer ends)"));
    }
    ++n;
    return absl::OkStatus();
  }
  void Give(uint32_t uid) {
    absl::MutexLock lock(&mu_);
    auto it = per_uid_.find(uid);
    if (it != per_uid_.end() && --it->second == 0) per_uid_.erase(it);
  }
  size_t Pending(uint32_t uid) const {
    absl::MutexLock lock(&mu_);
    auto it = per_uid_.find(uid);
    return it == per_uid_.end() ? 0 : it->second;
  }

 private:
  const size_t max_per_uid_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint32_t, size_t> per_uid_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvrail::session
