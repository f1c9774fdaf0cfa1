// Hot restart: a running kvraild (the predecessor) hands everything its clients hold - the
// session socket's listener and connections, the sessions with their secrets, unused fd tokens,
// regions with their descriptors, grants, completion queues, the ended transfers' statuses and
// the socket's lock - to a new kvraild (the successor) on the same node, which then serves them;
// the predecessor exits 0. Clients see a new Stats.instance_id and nothing else: the same
// lineage (Stats.lineage_id), session ids, secrets, region ids and transfer ids.
//
// The handover socket "<unix_socket>.handover" (SOCK_SEQPACKET, mode 0600) is the predecessor's.
// A successor connects and says HELLO; both check the other's uid (SO_PEERCRED: the same
// effective uid, or root), so a socket of another user is refused. The predecessor pauses
// (`Predecessor::prepare`: session socket paused, new work held back, running transfers
// finished), then sends the bundle: a HandoverState (state.proto) in chunks and the descriptors
// beside it (SCM_RIGHTS, duplicates: the predecessor still holds its own). The successor
// rebuilds, says COMMIT once nothing can fail any more; the predecessor lets go (RELEASED) and
// never serves again. If the successor dies, refuses or does not commit within the commit
// timeout, the predecessor resumes serving as before: a failed start is no outage.
//
// Thread contract: a Listener runs one thread of its own and calls the Predecessor callbacks
// there, one handover at a time; Takeover is used by one thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/unique_fd.h"
#include "daemon/handover/state.pb.h"

namespace kvrail::handover {

// The handover socket that belongs to a daemon's unix socket path.
std::string HandoverSocketPath(const std::string& unix_socket);

// How one daemon takes part in hot restarts, on either side (daemon/options.h,
// HotRestartOptionsFrom: the config's take_over, linger_after_handover, handover_timeout_ms).
struct HotRestartOptions {
  // This daemon's handover socket, served for its successor.
  std::string listen_path;
  // Empty: start cold. Otherwise the predecessor's handover socket to take over from.
  std::string take_over_path;
  // take_over "auto": when nothing answers take_over_path, start cold instead of failing.
  bool cold_when_nobody_answers = false;
  // The successor's wait for the bundle (Takeover::Begin; the predecessor finishes its running
  // transfers first).
  absl::Duration bundle_timeout = absl::Seconds(40);
  // The predecessor's wait for the successor's commit (Listener::Start).
  absl::Duration commit_timeout = absl::Seconds(30);
  // The successor's wait for RELEASED after its commit (Takeover::Commit).
  absl::Duration release_timeout = absl::Seconds(10);
  // After a release, idle until SIGTERM instead of exiting.
  bool linger_after_handover = false;
};

// The state and the descriptors its `*_fd` fields index.
struct Bundle {
  HandoverState state;
  std::vector<UniqueFd> fds;
};

// Whether a process of `peer_uid` may be the other end of a handover with this process
// (effective uid `own_euid`): the same uid, or root. PERMISSION_DENIED naming both otherwise.
absl::Status CheckPeerUid(uint32_t peer_uid, uint32_t own_euid);

// The bundle's wire form on a connected SOCK_SEQPACKET unix socket (exposed for tests): a header
// packet, then packets of at most 32 KiB of the message and 64 descriptors each.
absl::Status SendBundle(int sock, const Bundle& bundle);
// DEADLINE_EXCEEDED when the bundle is not whole within `timeout`; INVALID_ARGUMENT when the
// packets do not add up (the message does not parse, counts differ, descriptors truncated).
absl::StatusOr<Bundle> ReceiveBundle(int sock, absl::Duration timeout);

// What the predecessor does, called on the listener's thread.
struct Predecessor {
  // A successor asked: pause, finish running transfers, export. An error is sent to the
  // successor (REFUSED and the message) and `resume` is called.
  std::function<absl::StatusOr<Bundle>()> prepare;
  // The successor did not commit (or `prepare` failed): serve again as before.
  std::function<void()> resume;
  // The successor committed and serves now: this daemon must not serve again (called before
  // the successor hears RELEASED, so nothing of this daemon overlaps its serving).
  // `successor_address` is what the successor named in its commit (its gRPC socket's private
  // path, where calls still reaching this daemon can be sent on); may be empty.
  std::function<void(const std::string& successor_address)> released;
};

// The predecessor's end: serves the handover socket until a handover commits or it is
// destroyed (which removes the socket).
class Listener {
 public:
  virtual ~Listener() = default;
  // Binds `path` (replacing a stale socket there) with mode 0600. A successor that does not
  // commit within `commit_timeout` after the bundle is sent is given up.
  static absl::StatusOr<std::unique_ptr<Listener>> Start(const std::string& path,
                                                         Predecessor predecessor,
                                                         absl::Duration commit_timeout);
  // Whether a successor committed.
  virtual bool released() const = 0;
};

// The successor's end.
class Takeover {
 public:
  virtual ~Takeover() = default;
  // Connects to `path`, checks the predecessor's uid, says HELLO and receives the bundle,
  // waiting up to `timeout` (the predecessor finishes its running transfers first).
  // UNAVAILABLE when nothing listens there; PERMISSION_DENIED for another uid's socket;
  // FAILED_PRECONDITION with the predecessor's reason when it refused.
  static absl::StatusOr<std::unique_ptr<Takeover>> Begin(const std::string& path,
                                                         absl::Duration timeout);
  virtual Bundle& bundle() = 0;
  // Tells the predecessor that everything is rebuilt (naming `address`, see
  // Predecessor::released) and waits (up to `timeout`) for RELEASED. Only after OK may this
  // process serve; on an error it must exit without serving (the predecessor resumes when the
  // connection closes).
  virtual absl::Status Commit(absl::Duration timeout, const std::string& address = "") = 0;
};

}  // namespace kvrail::handover
