// Sessions: who is calling (docs/security.md). A session is a connection to the session socket
// (daemon/session); it has a secret (gRPC calls name it in their `kvrail-session` metadata:
// wire/session_wire.h), the uid of the process on its connection (SO_PEERCRED), and the
// descriptors its client passed, each waiting under a one-use fd token until a region
// registration takes it. Ending a session drops its unused descriptors, then runs the end hooks:
// its regions (daemon/regions), its grants (daemon/access), the daemon's per-session state.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/unique_fd.h"
#include "daemon/handover/state.pb.h"

namespace kvrail::sessions {

// Who is calling. Calls over gRPC are bound to a session by their `kvrail-session` metadata.
struct Caller {
  uint64_t session_id = 0;  // 0: anonymous (owns nothing)
  // SO_PEERCRED uid of the session's connection; -1 unknown (anonymous, or no credentials).
  // Named in audit lines (an operator cancelling another session's transfer).
  int64_t uid = -1;
  // Whether `uid` is 0 or the daemon's own (::geteuid()): may list every region and transfer;
  // root alone, from a session that owns no regions (the CLI), may cancel any transfer
  // (transfers/operator_cancel.h; an audit line). Changes nothing else it does not own (unregister,
  // grants, MarkReady) and moves no bytes without ownership or a grant either.
  bool operator_role() const;
};

// Caps on unused fd tokens (docs/security.md, "Caps"): RESOURCE_EXHAUSTED naming the cap beyond
// each. Sessions whose uid is unknown share one uid's count.
struct SessionLimits {
  size_t max_fd_tokens = 4096;              // every session together
  size_t max_fd_tokens_per_session = 1024;  // one session cannot take them all
  // The sessions of one uid together: one tenant opening several sessions cannot take them all
  // either (a quarter of max_fd_tokens).
  size_t max_fd_tokens_per_uid = 1024;
};

// A base for a daemon process's ids: a random multiple of 2^32 in [2^32, 2^63) (31 random bits;
// below 2^63 so signed 64-bit consumers read ids as positive). A daemon that restarts counts
// from new bases, so a client still holding an id of the previous instance gets NOT_FOUND rather
// than naming another client's session or region (the chance of a clash is 2^-31 per restart,
// until an instance has issued 2^32 ids). Thread-safe (std::random_device).
uint64_t RandomIdBase();

// 32 lowercase hex digits from std::random_device (session secrets, grant tokens). Thread-safe.
std::string RandomHex128();

// The daemon's sessions. Thread-safe.
class SessionTable {
 public:
  virtual ~SessionTable() = default;
  // Session ids count from `first_session_id` (1 for tests; kvraild passes RandomIdBase()).
  static std::unique_ptr<SessionTable> Create(SessionLimits limits = {},
                                              uint64_t first_session_id = 1);

  // A new open session with a fresh secret (128 random bits, hex) and an unknown uid.
  virtual uint64_t BeginSession() = 0;
  // The uid of the process on the session's connection (SO_PEERCRED), which decides whether the
  // session is the operator's and whose caps it counts against.
  virtual void SetSessionPeer(uint64_t session_id, uint32_t uid) = 0;
  // Drops the session's unused fd tokens, then calls the end hooks in the order they were added
  // (those added `after_others` last; outside the table's lock, on this thread). A session ends
  // once: ending an unknown or ended session does nothing.
  virtual void EndSession(uint64_t session_id) = 0;
  // Whether `session_id` was begun and has not ended.
  virtual bool SessionOpen(uint64_t session_id) const = 0;
  // The session's secret; "" for unknown sessions.
  virtual std::string SessionSecret(uint64_t session_id) const = 0;
  // The caller a `kvrail-session` credential names: UNAUTHENTICATED when the session is not
  // open or the secret differs (compared in constant time).
  virtual absl::StatusOr<Caller> Authenticate(uint64_t session_id,
                                              absl::string_view secret) const = 0;
  // The caller `session_id` is, for the daemon's own use (no secret): its uid, or -1 when the
  // session is unknown or its uid is.
  virtual Caller CallerOf(uint64_t session_id) const = 0;
  // Adds `hook`, called with a session's id when it ends (see EndSession). `after_others`: after
  // every hook added without it (daemon/access rechecks the grants transfers use once the other
  // hooks have ended what they end). For wiring: add hooks before sessions begin; they live as
  // long as the table.
  virtual void AddSessionEndHook(std::function<void(uint64_t)> hook, bool after_others = false) = 0;

  // --- fd tokens (single use, bound to their session) ---
  // Keeps `fd` under a new token of `session_id`. RESOURCE_EXHAUSTED naming the cap beyond
  // SessionLimits (max_fd_tokens, max_fd_tokens_per_session, max_fd_tokens_per_uid).
  virtual absl::StatusOr<std::string> AddFd(uint64_t session_id, UniqueFd fd) = 0;
  // The descriptor under `token`, which is used up. NOT_FOUND for unknown or used tokens,
  // PERMISSION_DENIED for another session's; both name spec.share.fd_token.
  virtual absl::StatusOr<UniqueFd> TakeFd(absl::string_view token, uint64_t session_id) = 0;
  // Puts a descriptor TakeFd gave back under its token (a registration that failed: a mistake
  // does not cost the client its fds). Dropped when the session has ended meanwhile.
  virtual void ReturnFd(const std::string& token, uint64_t session_id, UniqueFd fd) = 0;

  // --- Hot restart (daemon/handover) ---
  // The table's part of the state a successor rebuilds: open sessions (ids, secrets, uids),
  // unused fd tokens (duplicates of their descriptors appended to `fds`, named by index) and
  // the session id counter. The table is unchanged and keeps serving.
  virtual absl::Status ExportState(handover::RegionTableState* out,
                                   std::vector<UniqueFd>* fds) const = 0;
  // Rebuilds an empty table from a predecessor's state: the same session ids, secrets and uids,
  // and fd tokens (their descriptors taken out of `fds`). FAILED_PRECONDITION when a session
  // was begun here already; INVALID_ARGUMENT naming the field for a descriptor not in `fds`.
  // Import before the region table and the grants import theirs.
  virtual absl::Status ImportState(const handover::RegionTableState& state,
                                   std::vector<UniqueFd>* fds) = 0;
};

}  // namespace kvrail::sessions
