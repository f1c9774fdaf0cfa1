// The etcd v3 directory (docs/fabric.md, "Directory"): this daemon registers its node record
// under prefix + node_id with a TTL lease it keeps alive, reads the prefix (Range) and follows it
// (Watch from the Range's revision); static peers from the config are listed beside the etcd
// ones. The contract the fabric relies on is in directory.h.
//
// etcd unreachable: nothing is dropped, Status() turns "degraded" (reason, last error, since),
// and the session is retried with capped exponential backoff; each new session grants a new
// lease and puts the record again (the old lease may have expired meanwhile), then re-reads the
// prefix, so peers that left during the outage are marked down and new ones appear.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "daemon/directory/directory.h"
#include "daemon/directory/etcd_client.h"
#include "proto/kvrail/v1/admin.pb.h"

namespace kvrail::directory {

struct EtcdDirectoryOptions {
  std::string self;    // this node's id (its record's key is prefix + self)
  std::string prefix;  // ends with '/'
  int64_t ttl_s = 10;
  // This node's record (BuildNodeRecord); registered_unix_us is refreshed at each registration.
  v1::DirectoryNodeRecord record;
  // Config peers (node id -> address), listed whatever etcd says.
  std::map<std::string, std::string> static_peers;
  // For Status() only (the client has its own copy).
  std::vector<std::string> endpoints;
  // Timestamps (since, last error, registered). Not owned.
  Clock* clock = Clock::Real();
  // Lease keep-alive period; zero: ttl / 3.
  absl::Duration keepalive_interval = absl::ZeroDuration();
  // Reconnect backoff: from backoff_initial, doubling, capped at backoff_max (jittered).
  absl::Duration backoff_initial = absl::Milliseconds(200);
  absl::Duration backoff_max = absl::Seconds(5);
  std::function<double()> backoff_uniform01;  // jitter source; nullptr: random
  // Create waits this long for the first session attempt (so the fabric starts with the peers
  // etcd knows); after it, the directory starts degraded and keeps trying in the background.
  absl::Duration initial_wait = absl::Seconds(3);
  // On destruction, revoke the lease so peers see this node leave at once. Tests turn it off to
  // let the lease expire instead.
  bool revoke_on_close = true;
};

// Starts the session thread. Fails only on bad options.
absl::StatusOr<std::unique_ptr<Directory>> CreateEtcdDirectory(EtcdDirectoryOptions options,
                                                               std::unique_ptr<EtcdClient> client);

}  // namespace kvrail::directory
