// Many kvraild daemons, each in its own network namespace on one bridge, finding each other
// through a real etcd (Debian's etcd-server) that runs in the bridge's hub namespace: the shared
// set-up of the cluster test (CI) and the cluster benchmark (manual). Needs root; etcd is started
// and killed by pid, daemons likewise (tests/netns). Not thread-safe.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "proto/kvrail/v1/admin.pb.h"
#include "tests/harness/daemon_process.h"
#include "tests/netns/netns.h"
#include "tests/tls/test_ca.h"

namespace kvrail::testing {

// Why the cluster cannot run here ("" when it can): not root, or no namespaces (a reason to
// skip)...
std::string CannotRunCluster();
// ... or no etcd/etcdctl on PATH ("" when both are there): a set-up error on a root machine.
std::string MissingEtcd();

struct ClusterOptions {
  int etcd_ttl_s = 2;            // DaemonConfig.etcd.ttl_s
  bool tls = true;               // mTLS between daemons (test CA); false: insecure_peers
  uint64_t slot_bytes = 262144;  // small staging: 16 daemons x 15 peers stay cheap
  uint32_t slots = 4;
  uint64_t tile_bytes = 131072;
  std::string log_level = "info";
};

// One daemon of the cluster (its namespace stays when the daemon is killed, so it can restart).
struct ClusterNode {
  std::string name;
  const NetnsBridge::Node* net = nullptr;
  std::unique_ptr<NsDaemon> daemon;
  absl::Time started = absl::InfinitePast();  // when its process was forked
  bool running() const { return daemon != nullptr && daemon->pid > 0; }
};

class Cluster {
 public:
  explicit Cluster(const ClusterOptions& options = {});
  ~Cluster();
  // Set-up failures (bridge, CA, etcd): empty when fine.
  const std::string& error() const { return error_; }

  // etcd in the hub namespace, its data in a temporary folder kept across restarts. Waits until
  // it answers (etcdctl endpoint health). KillEtcd: SIGKILL by pid, waited for.
  bool StartEtcd();
  void KillEtcd();
  bool etcd_running() const { return etcd_pid_ > 0; }
  const std::string& etcd_endpoint() const { return etcd_endpoint_; }

  // A new node `name` in a new namespace, kvraild started there (configured with etcd only, no
  // static peers). nullptr on failure (the log is in error()).
  ClusterNode* AddNode(const std::string& name);
  // Kills `node`'s daemon by pid (SIGKILL) and waits for it; its namespace stays.
  void Kill(ClusterNode* node);
  // Starts `node`'s daemon again in its namespace (a new boot id).
  bool Restart(ClusterNode* node);

  std::deque<ClusterNode>& nodes() { return nodes_; }
  ClusterNode* Find(const std::string& name);
  std::vector<ClusterNode*> Running();

  // Polls every node of `observers` (ListPeers) until `done(observer, peers)` holds for each, or
  // `timeout` passes; returns, per observer, when it first held (InfinitePast: never).
  using PeersPredicate =
      std::function<bool(const ClusterNode& observer, const v1::ListPeersResponse& peers)>;
  std::vector<absl::Time> WaitAll(const std::vector<ClusterNode*>& observers,
                                  const PeersPredicate& done, absl::Duration timeout);
  // The state `peers` gives `node`, or PEER_STATE_UNSPECIFIED when it is not listed.
  static v1::PeerState StateOf(const v1::ListPeersResponse& peers, const std::string& node);
  // The registration time in `node`'s etcd record as `peers` shows it (InfinitePast: none).
  static absl::Time RegisteredAt(const v1::ListPeersResponse& peers, const std::string& node);

  // Logs of every node (for failure messages).
  std::string Logs() const;

 private:
  bool StartDaemon(ClusterNode* node);

  const ClusterOptions options_;
  std::string error_;
  NetnsBridge net_;
  std::unique_ptr<TestCa> ca_;
  TempDir etcd_dir_;
  pid_t etcd_pid_ = -1;
  std::string etcd_endpoint_, prefix_;
  std::deque<ClusterNode> nodes_;
};

}  // namespace kvrail::testing
