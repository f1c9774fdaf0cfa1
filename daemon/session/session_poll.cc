// The session server's poll loop (session_server_impl.h lists its parts): epoll over the
// listener, the sessions and their submission queues' eventfds, the spin, accepting connections
// within the caps and the descriptors left, and dropping them.
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/logging.h"
#include "base/predictive_wake.h"
#include "base/spin_budget.h"
#include "base/spin_pause.h"
#include "base/unique_fd.h"
#include "daemon/session/admission.h"
#include "daemon/session/session_server.h"
#include "daemon/session/session_server_impl.h"
#include "spdlog/spdlog.h"
#include "wire/session_wire.h"

namespace kvrail::session {

bool SessionServerImpl::Watch(int fd, uint64_t tag) {
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.u64 = tag;
  return ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &event) == 0;
}

void SessionServerImpl::Loop() {
  std::vector<epoll_event> events(256);
  // After serving a packet the thread polls without sleeping for options_.spin (the next
  // packet of a critical transfer, e.g. its WAIT, then costs no wake-up), and it polls the
  // submission queues that spin (SubmissionQueues). Both draw on one budget: each round that
  // polled and found nothing is held against it until the spin ends; a spin that found work
  // (a packet, a queue's entries) is free up to options_.spin_free and draws the rest, one that
  // ends with the thread going to sleep draws all it held, and once the budget is spent every
  // spin ends. Back-to-back traffic thus keeps the thread awake, while spins that wait for
  // nothing, or long, stay within the budget. Predictive wake (options_.predictive_wake) adds a
  // third spin, around a steady cadence's next arrival, drawn whole from the same budget.
  absl::Time spin_until = absl::InfinitePast();
  SpinBudget budget(options_.spin_budget, kSpinBudgetWindow, absl::Now());
  PredictiveWake wake(options_.wake);
  bool predictive = options_.predictive_wake && options_.spin_budget > 0;
  if (predictive) {
    // The timed sleep's deadline is the plan's: ended 50 us late by the default slack it would
    // spend the margin (base/predictive_wake.h).
    if (absl::Status slack = SetThreadTimerSlack(absl::Microseconds(1)); !slack.ok()) {
      spdlog::warn("session socket: predictive wake keeps the default timer slack: {}",
                   slack.ToString());
    }
  }
  // The predicted spins' counts (the options' when given), logged when the loop ends.
  SessionServerOptions::WakeCounts own_counts;
  SessionServerOptions::WakeCounts& counts =
      options_.wake_counts != nullptr ? *options_.wake_counts : own_counts;
  absl::Time predicted_until = absl::InfinitePast();  // the predicted spin's end
  bool predicted = false;                             // a predicted spin is under way
  while (!stop_.load()) {
    const absl::Time round = absl::Now();
    const bool may_spin = budget.Allows(round);
    if (!may_spin) spin_until = predicted_until = absl::InfinitePast();
    // While the listener is paused (out of descriptors with no reserve left) it is retried
    // every 100 ms instead of being polled in a spin.
    const bool spinning =
        (options_.spin > absl::ZeroDuration() && round < spin_until) || round < predicted_until;
    if (spinning && options_.spin_polls != nullptr) {
      options_.spin_polls->fetch_add(1, std::memory_order_relaxed);
    }
    // A round of polling only: nothing due, a spin is what keeps the thread awake.
    const bool spin_round = (spinning || queues_.Spinning()) && !queues_.Due();
    const bool sleeps = !spinning && !queues_.Busy();
    // Going to sleep: the spin that led here found nothing.
    if (sleeps && predicted) {
      predicted = false;
      wake.Missed();
      counts.misses.fetch_add(1, std::memory_order_relaxed);
    }
    if (sleeps) SettleSpin(budget);
    // Predictive wake: a timed sleep until the next arrival's window (none when it is due).
    PredictiveWake::Plan plan;
    if (sleeps && predictive && !listener_paused_) plan = wake.Next(round);
    if (plan.predicted && plan.wake_at <= round) {
      StartPredictedSpin(round, plan.spin_until, &predicted_until, &predicted, counts);
      continue;
    }
    int n = 0;
    if (plan.predicted) {
      n = EpollUntil(events, plan.wake_at);
      if (n == 0) {
        const absl::Time woke = absl::Now();
        wake.Woke(plan.wake_at, woke);
        StartPredictedSpin(woke, plan.spin_until, &predicted_until, &predicted, counts);
        continue;
      }
      if (n < 0 && errno == ENOSYS) {
        spdlog::warn("session socket: epoll_pwait2 is missing (Linux < 5.11): no predictive wake");
        predictive = false;
        continue;
      }
    } else {
      n = ::epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()),
                       !sleeps            ? 0
                       : listener_paused_ ? 100
                                          : -1);
    }
    const absl::Time polled = absl::Now();
    // Before the events: an eventfd that rang is looked at in this round, below.
    bool work = false;
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[i].data.u64;
      if (tag != kWakeTag) work = true;
      if (tag != kWakeTag && tag != kListenerTag && (tag & kSubmissionTag) != 0) {
        queues_.Woken(static_cast<int>(tag & ~kSubmissionTag));
      }
    }
    if (n == 0 && spinning && !queues_.Busy()) {
      if (predicted) YieldCpu();  // as below
      budget.Held(round, absl::Now());
      continue;
    }
    if (n > 0 && options_.spin > absl::ZeroDuration()) spin_until = absl::Now() + options_.spin;
    if (n < 0) {
      if (errno == EINTR) continue;
      spdlog::error("session socket: epoll_wait failed: {}", std::strerror(errno));
      return;
    }
    if (listener_paused_ && absl::Now() >= resume_at_) ResumeListener();
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[i].data.u64;
      if (tag == kWakeTag) continue;
      if (tag == kListenerTag) {
        AcceptAll();
      } else if ((tag & kSubmissionTag) != 0) {
        continue;  // taken in LookAtQueues
      } else {
        Serve(static_cast<int>(tag));
      }
    }
    const bool took = queues_.Busy() && LookAtQueues(may_spin);
    if (work || took) {
      if (predictive) wake.Arrived(polled);
      if (predicted) counts.hits.fetch_add(1, std::memory_order_relaxed);
      // The spin, if any, saved this work a wake-up; a predicted one is drawn whole.
      budget.Found(predicted ? absl::ZeroDuration() : options_.spin_free);
      predicted = false;
      predicted_until = absl::InfinitePast();
    } else if (spin_round) {
      // The predicted spin gives way each empty round: the client whose request it waits for may
      // be woken onto this CPU, and a spinner that keeps it until its slice ends (EEVDF's run to
      // parity) delays that request to the spin's end (~35 us after it, seen on 2 vCPUs). The
      // yield is held against the budget with the round (wall time: at least the CPU it took).
      if (predicted) YieldCpu();
      budget.Held(round, absl::Now());
    }
  }
  if (counts.spins.load() > 0) {
    spdlog::info(
        "session socket: predictive wake: {} spins around a predicted request, {} found it, {} "
        "missed (learned gap {} us, jitter {} us, timed-sleep overshoot {} us)",
        counts.spins.load(), counts.hits.load(), counts.misses.load(),
        absl::ToInt64Microseconds(wake.gap()), absl::ToInt64Microseconds(wake.jitter()),
        absl::ToInt64Microseconds(wake.overshoot()));
  }
}

int SessionServerImpl::EpollUntil(std::vector<epoll_event>& events, absl::Time until) {
  const absl::Duration left = std::max(until - absl::Now(), absl::ZeroDuration());
  const timespec timeout = absl::ToTimespec(left);
  return ::epoll_pwait2(epoll_.get(), events.data(), static_cast<int>(events.size()), &timeout,
                        nullptr);
}

void SessionServerImpl::StartPredictedSpin(absl::Time now, absl::Time until,
                                           absl::Time* predicted_until, bool* predicted,
                                           SessionServerOptions::WakeCounts& counts) {
  *predicted_until = until;
  *predicted = true;
  queues_.SpinUntil(now, until);
  counts.spins.fetch_add(1, std::memory_order_relaxed);
}

void SessionServerImpl::SettleSpin(SpinBudget& budget) {
  const absl::Duration drawn = budget.Settle();
  if (options_.spin_spent_ns != nullptr && drawn > absl::ZeroDuration()) {
    options_.spin_spent_ns->fetch_add(absl::ToInt64Nanoseconds(drawn), std::memory_order_relaxed);
  }
}

void SessionServerImpl::PauseListener() {
  if (listener_paused_) return;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, listener_.get(), nullptr);
  listener_paused_ = true;
  resume_at_ = absl::Now() + absl::Milliseconds(100);
}

void SessionServerImpl::ResumeListener() {
  listener_paused_ = false;
  if (!reserve_.valid()) reserve_ = OpenReserve();
  if (!Watch(listener_.get(), kListenerTag)) PauseListener();
}

void SessionServerImpl::AcceptAll() {
  for (int i = 0; i < 64 && !listener_paused_; ++i) {
    UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (fd.valid()) {
      Admit(std::move(fd));
      continue;
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
      RefuseWithReserve();
      continue;
    }
    return;  // EAGAIN: nothing more pending
  }
}

void SessionServerImpl::RefuseWithReserve() {
  if (!reserve_.valid()) {
    spdlog::warn("session socket: out of file descriptors; refusing connections for 100 ms");
    PauseListener();
    return;
  }
  reserve_ = UniqueFd();
  UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (fd.valid()) SendPacket(fd.get(), wire::EncodeRejected(ShortOfFdsError()));
  fd = UniqueFd();
  reserve_ = OpenReserve();
  if (++refused_for_fds_ % 1000 == 1) {
    spdlog::warn("session socket: out of file descriptors; connections refused ({} so far)",
                 refused_for_fds_);
  }
  if (!reserve_.valid()) PauseListener();
}

absl::Status SessionServerImpl::CheckCaps(int fd, uint32_t uid) const {
  if (ShortOfFds(fd, options_.fd_headroom)) return ShortOfFdsError();
  if (sessions_.size() >= options_.max_sessions) {
    return absl::ResourceExhaustedError(
        absl::StrCat("max_sessions: ", sessions_.size(),
                     " sessions are open, the most this daemon serves "
                     "(DaemonConfig.max_sessions)"));
  }
  auto it = per_uid_.find(uid);
  if (it != per_uid_.end() && it->second >= options_.max_sessions_per_uid) {
    return absl::ResourceExhaustedError(
        absl::StrCat("max_sessions_per_uid: uid ", uid, " has ", it->second,
                     " sessions open, the most allowed (DaemonConfig.max_sessions_per_uid)"));
  }
  return absl::OkStatus();
}

void SessionServerImpl::Admit(UniqueFd fd) {
  // The connection's process (SO_PEERCRED) decides whether the session is the operator's.
  struct ucred cred {};
  socklen_t len = sizeof(cred);
  const bool known = ::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0;
  const uint32_t uid = known ? cred.uid : ~uint32_t{0};
  if (absl::Status capped = CheckCaps(fd.get(), uid); !capped.ok()) {
    KVRAIL_DEBUG("session refused: {}", capped.ToString());
    SendPacket(fd.get(), wire::EncodeRejected(capped));
    return;
  }
  const int raw = fd.get();
  epoll_event event{};
  event.events = EPOLLIN | EPOLLRDHUP;
  event.data.u64 = static_cast<uint64_t>(raw);
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, raw, &event) != 0) {
    SendPacket(raw, wire::EncodeRejected(absl::ResourceExhaustedError(absl::StrCat(
                        "the daemon cannot watch another connection: ", std::strerror(errno)))));
    return;
  }
  const uint64_t id = table_->BeginSession();
  if (known) table_->SetSessionPeer(id, cred.uid);
  if (admission_ != nullptr) admission_->Open(id);
  // The secret goes to this connection only: it binds the client's gRPC calls to the session.
  SendPacket(raw, wire::EncodeGreeting(id, options_.instance_id, table_->SessionSecret(id)));
  KVRAIL_DEBUG("session {} opened (uid {})", id, uid);
  sessions_.emplace(raw, std::make_shared<Connection>(id, uid, std::move(fd)));
  ++per_uid_[uid];
  count_.store(sessions_.size());
}

void SessionServerImpl::Drop(absl::flat_hash_map<int, std::shared_ptr<Connection>>::iterator it) {
  const std::shared_ptr<Connection> conn = it->second;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, it->first, nullptr);
  if (conn->intake != nullptr) {
    // The client still holds the eventfd: unwatched here, or it would stay in the epoll set.
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, conn->intake->sq_eventfd(), nullptr);
    queues_.Remove(it->first);
  }
  conn->Close();
  if (admission_ != nullptr) {
    // Its queued packets are dropped unrun (nothing of them reaches its memory or its socket);
    // a SUBMIT being admitted finishes first, and the session ends after it, so that transfer
    // is ended with the session's others.
    const size_t dropped =
        admission_->Close(conn->id, [table = table_, id = conn->id] { table->EndSession(id); });
    if (dropped > 0) {
      spdlog::info("session {} closed with {} packets queued for admission: not served", conn->id,
                   dropped);
    }
  } else {
    table_->EndSession(conn->id);
  }
  auto uid = per_uid_.find(conn->uid);
  if (uid != per_uid_.end() && --uid->second == 0) per_uid_.erase(uid);
  sessions_.erase(it);
  count_.store(sessions_.size());
}

}  // namespace kvrail::session
