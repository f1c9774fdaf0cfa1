// The in-process daemon that the service fuzzers (transfer_service_fuzzer, peer_fuzzer) call:
// kvraild's session, region and grant tables, a host engine under a transfer manager with a
// notification hub, optionally a fabric (tcp;ofi_rxm on 127.0.0.1, one NIC, a static directory
// naming one peer, kPeerNode, that never answers), and the daemon's own gRPC server
// (daemon/server: Transfer and Admin; with the fabric its Peer service and Transfer.ExportRegion
// wired as kvraild wires them) on a unix socket in a temporary folder. The fabric's inbound
// transfers are not recorded by the manager (no InboundSink): the fuzzers call the Peer service,
// not the transfers it would list.
// A harness failure (anything here that does not work) traps with a message: it is no finding.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "daemon/access/access.h"
#include "daemon/directory/directory.h"
#include "daemon/engine/engine.h"
#include "daemon/fabric/fabric.h"
#include "daemon/regions/regions.h"
#include "daemon/server/server.h"
#include "daemon/sessions/sessions.h"
#include "daemon/transfers/notifications.h"
#include "daemon/transfers/transfers.h"
#include "proto/kvrail/v1/region.pb.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::fuzz {

// The one peer of the fabric's directory.
inline constexpr char kPeerNode[] = "peer-a";

// Prints "<fuzzer>: <what>" and traps unless `ok`.
void Check(bool ok, const char* what);

// A call that does not answer within its deadline is a hang (a finding), and so is an error
// without a message.
void CheckAnswered(const grpc::Status& s);

// `*out` = `tmpl` with the message in bytes [p, p + n) merged over it, or that message alone
// (`raw`); false when the bytes are no such message.
template <typename M>
bool Build(const M& tmpl, bool raw, const uint8_t* p, size_t n, M* out) {
  M fuzz;
  if (!fuzz.ParseFromArray(p, static_cast<int>(n))) return false;
  if (raw) {
    *out = fuzz;
  } else {
    *out = tmpl;
    out->MergeFrom(fuzz);
  }
  return true;
}

struct FuzzDaemonOptions {
  // Names the fuzzer in messages and the temporary folder (/tmp/kvrail-fuzz-<name>.XXXXXX).
  std::string name;
  // Builds the fabric (and serves the Peer service); without it ExportRegion is
  // FAILED_PRECONDITION, as in a kvraild without peers.
  bool fabric = false;
  // The fabric's staging: slots per lane and their size.
  uint32_t slots = 4;
  uint64_t slot_bytes = 64 << 10;
  // The server's watcher caps (ServerOptions).
  uint32_t max_watchers_per_session = 8;
  uint32_t max_watchers_per_uid = 16;
};

// Thread contract: the fuzzer's thread calls it; the parts are thread-safe. Made once per fuzzer
// process; destroy it before the process exits (libFuzzer ends with exit(): an atexit handler).
class FuzzDaemon {
 public:
  explicit FuzzDaemon(const FuzzDaemonOptions& options);
  // Stops in kvraild's order: the server (its calls end), the manager (drained), the fabric's
  // threads, the engine, then the tables.
  ~FuzzDaemon();
  FuzzDaemon(const FuzzDaemon&) = delete;
  FuzzDaemon& operator=(const FuzzDaemon&) = delete;

  // A session as the session socket opens it (no uid: never the operator).
  uint64_t OpenSession();
  // The kvrail-session metadata value of `session`.
  std::string Credential(uint64_t session) const;
  // Registers `spec` for `session` over a fresh memfd of spec.size_bytes (the spec's memory kind
  // and share are filled); returns the region id.
  uint64_t RegisterHostRegion(uint64_t session, v1::RegionSpec spec);
  // The owner `session`'s grant of `region`.
  v1::Grant Grant(uint64_t session, uint64_t region, v1::GrantAccess access);
  // A call context with a 10 s deadline, carrying `credential` unless it is empty (anonymous).
  std::unique_ptr<grpc::ClientContext> Context(const std::string& credential) const;

  // A channel to the server's unix socket.
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  access::Grants& grants() { return *grants_; }

 private:
  const std::string name_;
  std::string dir_;
  std::unique_ptr<sessions::SessionTable> sessions_;
  std::unique_ptr<regions::RegionTable> regions_;
  std::unique_ptr<access::Grants> grants_;
  std::unique_ptr<directory::Directory> directory_;
  std::unique_ptr<fabric::Fabric> fabric_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<transfers::NotificationHub> hub_;
  std::unique_ptr<transfers::TransferManager> transfers_;
  std::unique_ptr<server::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

}  // namespace kvrail::fuzz
