// Network-namespace helpers shared by the multi-node test and the fabric benchmark: two namespaces
// joined by a veth pair (deleted on destruction), and kvraild started inside a namespace with a
// fabric config. Needs root; CannotMakeNamespaces() says why not when it is missing.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/kvrail_client.h"
#include "tests/harness/daemon_process.h"
#include "tests/tls/test_ca.h"

namespace kvrail::testing {

// Runs `cmd` through the shell, output discarded; returns its exit status (-1 if it did not exit).
int Sh(const std::string& cmd);

// Why namespaces cannot be made here, or "" when they can.
std::string CannotMakeNamespaces();

// Two namespaces joined by a veth pair, 10.S.0.1 <-> 10.S.0.2 (names unique per process and
// instance); both namespaces (and so the veth pair) are deleted on destruction.
struct NetnsPair {
  std::string ns_a, ns_b, veth_a, veth_b, ip_a, ip_b;
  bool ok = false;
  NetnsPair();
  ~NetnsPair();
  NetnsPair(const NetnsPair&) = delete;
  NetnsPair& operator=(const NetnsPair&) = delete;
  // "ip netns exec NS CMD".
  static std::string In(const std::string& ns, const std::string& cmd);
};

// How an NsDaemon is configured (defaults: what fabric_netns_test uses).
struct NsDaemonOptions {
  int nics = 2;                   // fabric endpoints, all on the daemon's address
  int port = 7070;                // --tcp-listen port of this daemon
  int peer_port = 7070;           // the peer's --tcp-listen port
  uint64_t tile_bytes = 262144;   // --tile-bytes
  uint64_t slot_bytes = 1048576;  // fabric.slot_bytes
  uint32_t slots = 8;             // fabric.slots
  std::string log_level = "info";
  // mTLS between the daemons with a certificate from this CA for the node (CN = node id);
  // nullptr: --insecure-peers. Not owned.
  TestCa* ca = nullptr;
  // Non-empty: one fabric endpoint per address here (in order) instead of `nics` on the daemon's
  // own address (several links, e.g. one veth pair per lane).
  std::vector<std::string> nic_ips;
  // Extra lines inside `fabric { }` ("lane_timeout_ms: 200").
  std::string fabric_extra;
  // Extra top-level DaemonConfig text ("etcd { endpoints: ... }").
  std::string extra_config;
};

// A hub namespace holding a bridge (10.S.0.254/24) that any number of node namespaces join, each
// through its own veth pair (node end 10.S.0.N, N = 1, 2, ... in order of AddNode). Services the
// nodes share (etcd) run in the hub on hub_ip. Names are unique per process and instance; every
// namespace (and so every veth and the bridge) is deleted on destruction.
struct NetnsBridge {
  struct Node {
    std::string ns, veth, ip;
  };
  std::string hub_ns, bridge, hub_ip;
  std::deque<Node> nodes;  // pointers from AddNode stay valid
  bool ok = false;
  NetnsBridge();
  ~NetnsBridge();
  NetnsBridge(const NetnsBridge&) = delete;
  NetnsBridge& operator=(const NetnsBridge&) = delete;
  // A new namespace on the bridge; nullptr when it could not be made (at most 250 nodes).
  const Node* AddNode();

 private:
  std::string tag_, subnet_;
};

// kvraild started with `ip netns exec NS` (directly when NS is empty); killed (SIGTERM) on
// destruction. An empty `peer` configures no static peer (the directory brings them, e.g. etcd in
// extra_config).
struct NsDaemon {
  TempDir dir;
  pid_t pid = -1;
  std::string socket, log;
  int tcp_port = 0;  // where --tcp-listen bound
  std::unique_ptr<client::Client> client;

  bool Start(const std::string& ns, const std::string& node, const std::string& ip,
             const std::string& peer, const std::string& peer_ip, const NsDaemonOptions& options);
  bool Start(const std::string& ns, const std::string& node, const std::string& ip,
             const std::string& peer, const std::string& peer_ip, int nics) {
    NsDaemonOptions options;
    options.nics = nics;
    return Start(ns, node, ip, peer, peer_ip, options);
  }
  void Kill(int sig);
  std::string Log() const;
  // Transfer.ExportRegion of a region `client` registered (only its owner may export it).
  absl::Status Export(uint64_t region, const std::string& to);
  // A write grant of that region by its owner (`client`): what a push from another node puts in
  // spec.dst.grant (the export alone lets no tenant of that node write). "" on failure.
  std::string WriteGrant(uint64_t region);
  ~NsDaemon();
};

// A loopback address 127.x.y.z whose port 7070 (NsDaemon's --tcp-listen) is free now. Random,
// not from the pid: Bazel's sandbox gives every test its own pid namespace, so parallel runs of a
// test (--runs_per_test) would otherwise all pick the same addresses and talk to each
// other's daemons.
std::string LoopbackIp();

// The fabric engine's gauge `name` in `node`'s stats (-1 when absent or the call fails).
double FabricGauge(NsDaemon& node, const std::string& name);

}  // namespace kvrail::testing
