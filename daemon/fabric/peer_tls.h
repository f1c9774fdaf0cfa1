// mTLS between daemons (docs/security.md, "Peers"): the node's certificate files loaded once at
// start, and the gRPC credentials built from them for the TCP listener (client certificates
// required and verified against the CA) and for the channels to peers (this node's certificate
// presented, the peer's verified against the CA and its node id). Pure functions; any thread.
#pragma once

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/fabric/fabric_options.h"
#include "proto/kvrail/v1/config.pb.h"

namespace kvrail::fabric {

// Reads ca_file, cert_file and key_file (PEM). Errors name the key: "peer_tls.cert_file: ...".
absl::StatusOr<std::shared_ptr<const PeerTlsPem>> LoadPeerTls(const v1::PeerTls& files);

// The TCP listener's credentials: with `tls`, SSL with client certificates required and verified
// against tls->ca; without (insecure_peers), plaintext.
std::shared_ptr<grpc::ServerCredentials> PeerServerCredentials(
    const std::shared_ptr<const PeerTlsPem>& tls);

// A channel to peer `node_id` at `address`: with `tls`, SSL presenting this node's certificate
// and accepting only a server certificate from the CA that names `node_id`; without, plaintext.
// `args` carries the caller's other channel settings.
std::shared_ptr<grpc::Channel> PeerChannel(const std::string& address, const std::string& node_id,
                                           const std::shared_ptr<const PeerTlsPem>& tls,
                                           grpc::ChannelArguments args);

}  // namespace kvrail::fabric
