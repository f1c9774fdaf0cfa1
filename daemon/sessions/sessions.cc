#include "daemon/sessions/sessions.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace kvrail::sessions {
namespace {

// Thread-safe: every field is guarded by mu_; hooks run outside it.
class SessionTableImpl final : public SessionTable {
 public:
  SessionTableImpl(SessionLimits limits, uint64_t first_session_id)
      : limits_(limits), next_session_(first_session_id) {}

  uint64_t BeginSession() override ABSL_LOCKS_EXCLUDED(mu_) {
    std::string secret = RandomHex128();  // outside the lock: random_device may block briefly
    absl::MutexLock lock(&mu_);
    sessions_[next_session_] = Session{std::move(secret), -1};
    return next_session_++;
  }

  void SetSessionPeer(uint64_t session_id, uint32_t uid) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session_id);
    if (it != sessions_.end()) it->second.uid = static_cast<int64_t>(uid);
  }

  void EndSession(uint64_t session_id) override ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<std::function<void(uint64_t)>> hooks;
    std::vector<UniqueFd> dropped;  // closed outside the lock
    {
      absl::MutexLock lock(&mu_);
      if (sessions_.erase(session_id) == 0) return;
      for (auto it = tokens_.begin(); it != tokens_.end();) {
        auto next = std::next(it);
        if (it->second.session_id == session_id) {
          dropped.push_back(std::move(it->second.fd));
          EraseTokenLocked(it);
        }
        it = next;
      }
      hooks = end_hooks_;
      hooks.insert(hooks.end(), late_hooks_.begin(), late_hooks_.end());
    }
    dropped.clear();
    for (const auto& hook : hooks) hook(session_id);
  }

  bool SessionOpen(uint64_t session_id) const override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return sessions_.contains(session_id);
  }

  std::string SessionSecret(uint64_t session_id) const override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session_id);
    return it == sessions_.end() ? std::string() : it->second.secret;
  }

  absl::StatusOr<Caller> Authenticate(uint64_t session_id, absl::string_view secret) const override
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session_id);
    // The comparison looks at every character whatever matches, so timing says nothing.
    bool same = it != sessions_.end() && it->second.secret.size() == secret.size();
    if (it != sessions_.end()) {
      unsigned diff = it->second.secret.size() ^ secret.size();
      for (size_t i = 0; i < secret.size() && i < it->second.secret.size(); ++i) {
        diff |= static_cast<unsigned char>(it->second.secret[i]) ^
                static_cast<unsigned char>(secret[i]);
      }
      same = same && diff == 0;
    }
    if (!same) {
      return absl::UnauthenticatedError(
          "kvrail-session: not an open session of this daemon, or the wrong secret");
    }
    return CallerOfLocked(session_id);
  }

  Caller CallerOf(uint64_t session_id) const override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return CallerOfLocked(session_id);
  }

  void AddSessionEndHook(std::function<void(uint64_t)> hook, bool after_others) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    (after_others ? late_hooks_ : end_hooks_).push_back(std::move(hook));
  }

  absl::StatusOr<std::string> AddFd(uint64_t session_id, UniqueFd fd) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (tokens_.size() >= limits_.max_fd_tokens) {
      return absl::ResourceExhaustedError(
          absl::StrCat("max_fd_tokens: kvraild holds ", tokens_.size(),
                       " unused fd tokens of every uid (at most ", limits_.max_fd_tokens,
                       "); register or close them"));
    }
    const size_t held = Count(per_session_, session_id);
    if (held >= limits_.max_fd_tokens_per_session) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "max_fd_tokens_per_session: the session holds ", held, " unused fd tokens (at most ",
          limits_.max_fd_tokens_per_session, " per session); register or close them"));
    }
    const int64_t uid = CallerOfLocked(session_id).uid;
    const size_t uid_held = Count(per_uid_, uid);
    if (uid_held >= limits_.max_fd_tokens_per_uid) {
      return absl::ResourceExhaustedError(
          absl::StrCat("max_fd_tokens_per_uid: uid ", uid, " holds ", uid_held,
                       " unused fd tokens in all its sessions (at most ",
                       limits_.max_fd_tokens_per_uid, " per uid); register or close them"));
    }
    std::string token;
    do {
      token =
          absl::StrCat(absl::Hex(rng_(), absl::kZeroPad16), absl::Hex(rng_(), absl::kZeroPad16));
    } while (tokens_.contains(token));
    AddTokenLocked(token, session_id, uid, std::move(fd));
    return token;
  }

  absl::StatusOr<UniqueFd> TakeFd(absl::string_view token, uint64_t session_id) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = tokens_.find(token);
    if (it == tokens_.end()) {
      return absl::NotFoundError("spec.share.fd_token: unknown or already used token");
    }
    if (it->second.session_id != session_id) {
      return absl::PermissionDeniedError(
          "spec.share.fd_token: the token belongs to another session (session_id must be the "
          "session that passed the fd)");
    }
    UniqueFd fd = std::move(it->second.fd);
    EraseTokenLocked(it);
    return fd;
  }

  void ReturnFd(const std::string& token, uint64_t session_id, UniqueFd fd) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (!sessions_.contains(session_id) || tokens_.contains(token)) return;  // `fd` closes
    AddTokenLocked(token, session_id, CallerOfLocked(session_id).uid, std::move(fd));
  }

  absl::Status ExportState(handover::RegionTableState* out,
                           std::vector<UniqueFd>* fds) const override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    out->set_next_session_id(next_session_);
    for (const auto& [id, session] : sessions_) {
      handover::SessionRecord* record = out->add_sessions();
      record->set_session_id(id);
      record->set_secret(session.secret);
      record->set_uid(session.uid);
    }
    for (const auto& [token, pending] : tokens_) {
      // A duplicate, so this table keeps serving unchanged if the successor never commits.
      UniqueFd copy(::fcntl(pending.fd.get(), F_DUPFD_CLOEXEC, 0));
      if (!copy.valid()) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "handover: cannot duplicate an fd token's descriptor: ", std::strerror(errno)));
      }
      fds->push_back(std::move(copy));
      handover::PendingFdRecord* record = out->add_pending_fds();
      record->set_token(token);
      record->set_session_id(pending.session_id);
      record->set_fd(static_cast<int32_t>(fds->size() - 1));
    }
    return absl::OkStatus();
  }

  absl::Status ImportState(const handover::RegionTableState& state,
                           std::vector<UniqueFd>* fds) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (!sessions_.empty()) {
      return absl::FailedPreconditionError("handover: the session table is not empty");
    }
    next_session_ = std::max(next_session_, state.next_session_id());
    for (const handover::SessionRecord& session : state.sessions()) {
      sessions_[session.session_id()] = Session{session.secret(), session.uid()};
    }
    for (const handover::PendingFdRecord& pending : state.pending_fds()) {
      // Each index names a descriptor of the bundle, used once.
      const int32_t index = pending.fd();
      if (index < 0 || static_cast<size_t>(index) >= fds->size() || !(*fds)[index].valid()) {
        return absl::InvalidArgumentError(absl::StrCat("pending_fds.fd: descriptor ", index,
                                                       " is not in the bundle (or used twice)"));
      }
      if (!sessions_.contains(pending.session_id()) || tokens_.contains(pending.token())) {
        continue;  // its session was not handed over: the descriptor closes with the bundle
      }
      AddTokenLocked(pending.token(), pending.session_id(),
                     CallerOfLocked(pending.session_id()).uid, std::move((*fds)[index]));
    }
    return absl::OkStatus();
  }

 private:
  struct Session {
    std::string secret;
    int64_t uid = -1;  // SO_PEERCRED of its connection; -1 unknown
  };
  struct PendingFd {
    uint64_t session_id;
    int64_t uid;  // counted against this uid until taken
    UniqueFd fd;
  };
  using Tokens = absl::flat_hash_map<std::string, PendingFd>;

  template <typename Map, typename Key>
  static size_t Count(const Map& counts, Key key) {
    auto it = counts.find(key);
    return it == counts.end() ? 0 : it->second;
  }
  template <typename Map, typename Key>
  static void Decrement(Map& counts, Key key) {
    auto it = counts.find(key);
    if (it != counts.end() && --it->second == 0) counts.erase(it);
  }

  Caller CallerOfLocked(uint64_t session_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Caller caller;
    caller.session_id = session_id;
    auto it = sessions_.find(session_id);
    caller.uid = it == sessions_.end() ? -1 : it->second.uid;
    return caller;
  }

  void AddTokenLocked(const std::string& token, uint64_t session_id, int64_t uid, UniqueFd fd)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    tokens_.emplace(token, PendingFd{session_id, uid, std::move(fd)});
    ++per_session_[session_id];
    ++per_uid_[uid];
  }

  void EraseTokenLocked(Tokens::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Decrement(per_session_, it->second.session_id);
    Decrement(per_uid_, it->second.uid);
    tokens_.erase(it);
  }

  const SessionLimits limits_;
  mutable absl::Mutex mu_;
  uint64_t next_session_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Session> sessions_ ABSL_GUARDED_BY(mu_);  // open sessions
  Tokens tokens_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, size_t> per_session_ ABSL_GUARDED_BY(mu_);  // unused tokens
  absl::flat_hash_map<int64_t, size_t> per_uid_ ABSL_GUARDED_BY(mu_);       // unused tokens
  std::vector<std::function<void(uint64_t)>> end_hooks_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void(uint64_t)>> late_hooks_ ABSL_GUARDED_BY(mu_);  // after_others
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_){std::random_device{}()};
};

}  // namespace

bool Caller::operator_role() const {
  return uid == 0 || (uid >= 0 && uid == static_cast<int64_t>(::geteuid()));
}

uint64_t RandomIdBase() {
  std::random_device random;
  // 31 random bits, never 0: a base in [2^32, 2^63).
  const uint64_t high = static_cast<uint64_t>(random()) & 0x7fffffffu;
  return (high == 0 ? 1 : high) << 32;
}

std::string RandomHex128() {
  std::random_device random;
  std::string out;
  for (int i = 0; i < 4; ++i) absl::StrAppend(&out, absl::Hex(random(), absl::kZeroPad8));
  return out;
}

std::unique_ptr<SessionTable> SessionTable::Create(SessionLimits limits,
                                                   uint64_t first_session_id) {
  return std::make_unique<SessionTableImpl>(limits, first_session_id);
}

}  // namespace kvrail::sessions
