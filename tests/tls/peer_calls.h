// Calls to daemons' Peer service over mTLS, for the tests that peer kvraild daemons with
// certificates from a TestCa (tests/netns:peer_tls_test, tests/fault:peer_attack_test): a
// channel presenting a certificate the CA issued, bounded call contexts, status checks, a Hello
// that claims a node, and waiting for a peer to be up. Not thread-safe (TestCa is not).
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "proto/kvrail/peer/v1/peer.grpc.pb.h"
#include "tests/netns/netns.h"
#include "tests/tls/test_ca.h"

namespace kvrail::testing {

namespace peer_v1 = ::kvrail::peer::v1;

// A file's whole contents ("" when it cannot be read).
std::string ReadFile(const std::string& path);

// Options for a daemon peered over mTLS with certificates from `ca` (one NIC).
NsDaemonOptions TlsDaemonOptions(TestCa* ca);

// A caller of a daemon's TCP port at `address`. The daemon's certificate is checked against `ca`
// and must name `server_node`; when `issuer` is given, the certificate it issues for CN `cert`
// is presented (what a node holding that certificate can do).
std::shared_ptr<grpc::Channel> TlsChannel(const std::string& address, TestCa& ca,
                                          const std::string& server_node, TestCa* issuer,
                                          const std::string& cert);

// A client context with a 5 s deadline.
std::unique_ptr<grpc::ClientContext> Context();

// Whether `status` has `code` and its message contains `text`; when not, the status is added to
// the next assertion's messages (UNSCOPED_INFO).
bool Says(const grpc::Status& status, grpc::StatusCode code, const std::string& text);

// A well-formed Hello claiming to be `node` (one NIC, tcp;ofi_rxm, a 16-byte address).
peer_v1::HelloRequest HelloAs(const std::string& node);

// Whether `node` lists peer `peer` as up within `wait`.
bool PeerUp(NsDaemon& node, const std::string& peer, absl::Duration wait);

}  // namespace kvrail::testing
