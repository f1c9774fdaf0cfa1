// gRPC adapters for the Transfer and Admin services and the health service. Errors become
// grpc::Status through base/grpc_status.h (code number and message kept).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/access/access.h"
#include "daemon/regions/regions.h"
#include "daemon/sessions/sessions.h"
#include "daemon/transfers/transfers.h"
#include "proto/kvrail/v1/admin.pb.h"
#include "proto/kvrail/v1/topology.pb.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace grpc {
class Service;
class ServerCredentials;
}  // namespace grpc

namespace kvrail::server {

// Transfer.ExportRegion's work once the server has found the caller may export (the fabric's
// leases): lets node `peer_node` write region `region_id`; returns the lease. Errors name the
// field. Thread-safe.
using ExportRegionFn = std::function<absl::StatusOr<v1::RegionLease>(uint64_t region_id,
                                                                     const std::string& peer_node)>;

struct ServerOptions {
  // "unix:/run/kvrail/kvrail.sock", "127.0.0.1:7070", ...
  std::vector<std::string> listen;
  std::string version;
  std::string node_id;
  // Stats.instance_id: this daemon process's instance (session::NewInstanceId).
  std::string instance_id;
  // Stats.lineage_id: kept across hot restarts (daemon/handover).
  std::string lineage_id;
  // What GetTopology returns.
  v1::GetTopologyResponse topology;
  // Returns the peer directory for ListPeers.
  std::vector<v1::PeerInfo> peers;
  // When set, ListPeers asks it (live states) instead of returning `peers`.
  std::function<std::vector<v1::PeerInfo>()> list_peers;
  // Where PollNotifications / WatchNotifications read (nullptr: they answer UNIMPLEMENTED).
  // Not owned; outlives the server.
  transfers::NotificationHub* notifications = nullptr;
  // Serve Transfer and Admin calls arriving over TCP too (DaemonConfig.tcp_serves_api);
  // otherwise they are PERMISSION_DENIED there (only the Peer service answers on TCP).
  bool tcp_serves_api = false;
  // Exports regions to other nodes (Fabric::ExportRegion); unset (no fabric): ExportRegion is
  // FAILED_PRECONDITION.
  ExportRegionFn export_region;
  // More services to serve on the same addresses (the fabric's Peer service). Not owned.
  std::vector<grpc::Service*> extra_services;
  // Credentials of the TCP listen addresses (fabric::PeerServerCredentials: mTLS with client
  // certificates required); nullptr: plaintext (insecure_peers). The unix socket is plaintext.
  std::shared_ptr<grpc::ServerCredentials> tcp_credentials;
  // Waits and watches (WaitTransfer, WatchTransfer, WatchNotifications) open at once per session
  // (DaemonConfig.max_watchers_per_session); beyond, RESOURCE_EXHAUSTED naming it.
  uint32_t max_watchers_per_session = 64;
  // The same for all sessions of one uid together (DaemonConfig.max_watchers_per_uid).
  // Waits and watches hold no server thread (gRPC's callback API): these caps bound their
  // memory and polling, not threads.
  uint32_t max_watchers_per_uid = 1024;
  // Stats fields fixed at start (mps, build_info): GetStats answers them as given.
  v1::Stats stats_base;
  // The peer directory's state for Stats.directory; when set, the health service also answers
  // "kvrail.v1.Directory" (NOT_SERVING while degraded: a readiness detail; liveness "" and
  // "kvrail.v1.Transfer" do not depend on it). See SetDirectoryServing.
  std::function<v1::DirectoryStatus()> directory_status;
};

// Owns the grpc::Server. Thread-safe; the services run on gRPC's thread pool.
class Server {
 public:
  virtual ~Server() = default;
  // The tables and the manager outlive the server.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options,
                                                       const sessions::SessionTable* sessions,
                                                       regions::RegionTable* regions,
                                                       access::Grants* grants,
                                                       transfers::TransferManager* transfers);
  // Marks readiness (health service "kvrail.v1.Transfer") NOT_SERVING: drain has begun. Liveness
  // (service "") stays SERVING until the server shuts down, so a draining daemon is not killed.
  virtual void SetNotServing() = 0;
  // The health service's "kvrail.v1.Directory": SERVING when the directory is ok, NOT_SERVING
  // when degraded (etcd unreachable). Liveness is not affected.
  virtual void SetDirectoryServing(bool ok) = 0;
  // Stops accepting calls and waits up to `deadline` for running ones (long watches are
  // cancelled at the deadline).
  virtual void Shutdown(absl::Duration deadline) = 0;
  // The TCP port bound when a listen address asked for port 0 (else 0).
  virtual int tcp_port() const = 0;

  // --- Hot restart (daemon/handover) ---
  // Calls that change what a handover moves (RegisterRegion, UnregisterRegion, SubmitTransfer,
  // CreateGrant, RevokeGrant) wait from HoldChanges (which returns once none runs) until
  // ResumeChanges; after ForwardChanges they, and PollNotifications, are made on the successor
  // at gRPC target `successor` (connected before this returns, up to 2 s) with the caller's
  // credentials and deadline, and its answer is the answer (a client whose connection still
  // reaches this daemon loses nothing). With `successor` empty they are refused UNAVAILABLE.
  virtual void HoldChanges() = 0;
  virtual void ResumeChanges() = 0;
  virtual void ForwardChanges(const std::string& successor) = 0;
};

}  // namespace kvrail::server
