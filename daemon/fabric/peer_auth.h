// Internal to the fabric module (peer_tls.h re-exports the credentials for the daemon): who a
// peer is and what it may send. The node id a caller speaks for comes from its certificate (the
// subject common name, checked against the CA by gRPC's mTLS handshake); every node id a message
// claims must be that one; every size a peer supplies is bounded before it is used. Pure
// functions (any thread) but AuthenticatedNode and CheckServerCertificate, which read a call's
// AuthContext.
#pragma once

#include <grpcpp/client_context.h>
#include <grpcpp/server_context.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/kvrail/peer/v1/peer.pb.h"

namespace kvrail::fabric {

namespace peer_v1 = ::kvrail::peer::v1;

// Bounds on what a peer sends (docs/security.md, "Peers").
inline constexpr size_t kMaxNodeIdBytes = 253;
inline constexpr int kMaxPeerNics = 64;
inline constexpr size_t kMaxFabricAddressBytes = 256;
inline constexpr size_t kMaxPeerTextBytes = 1024;  // names, versions, summaries, messages
inline constexpr uint64_t kMinPeerTileBytes = 4096;
inline constexpr uint32_t kMaxPeerTiles = 1u << 20;
inline constexpr uint32_t kMaxPeerIndex = 126;  // 7 bits of immediate data

// The node id a certificate speaks for, from the common names gRPC reports for it
// (x509_common_name): exactly one, non-empty, at most kMaxNodeIdBytes, no control characters.
// UNAUTHENTICATED otherwise (the message says why, naming "certificate CN").
absl::StatusOr<std::string> NodeIdFromCommonNames(const std::vector<std::string>& common_names);

// The common names in a certificate subject as gRPC reports it (x509_subject: OpenSSL's RFC 2253
// form, "CN=b,O=x,CN=a", last RDN first; `\` escapes the next character, `+` joins the
// attributes of one RDN). gRPC's x509_common_name holds only the subject's first CN, so a
// certificate with two CNs would be read as its first: the count must come from here. Pure.
std::vector<std::string> CommonNamesOfSubject(absl::string_view subject);

// The node id of a verified peer certificate from gRPC's properties: `subject_cns` (from
// CommonNamesOfSubject) must be exactly one name, equal to the one x509_common_name reported
// (`reported_cns`); then NodeIdFromCommonNames. UNAUTHENTICATED naming "certificate CN" otherwise.
absl::StatusOr<std::string> NodeIdFromCertificate(const std::vector<std::string>& reported_cns,
                                                  const std::vector<std::string>& subject_cns);

// The node id of the caller of a Peer RPC over mTLS: UNAUTHENTICATED when the call carries no
// verified certificate (the unix socket, an insecure listener) or its CN is unusable.
absl::StatusOr<std::string> AuthenticatedNode(const grpc::ServerContext& context);

// After a call to peer `node` over mTLS: the server's certificate must name exactly `node`
// (one CN; gRPC's own name check reads only the first CN). OK over a channel without TLS
// (insecure_peers). UNAUTHENTICATED naming "certificate CN" after `prefix` otherwise.
absl::Status CheckServerCertificate(const grpc::ClientContext& context, absl::string_view node,
                                    absl::string_view prefix);

// `claimed` (the message's `field`) must be `authenticated`: PERMISSION_DENIED naming the field
// and both ids (the claimed one cut to kMaxNodeIdBytes) otherwise.
absl::Status CheckClaimedNode(absl::string_view claimed, absl::string_view authenticated,
                              absl::string_view field);

// A Hello's sizes: node id, provider, at most kMaxPeerNics NICs whose names and fabric
// addresses are bounded, your_index in 7 bits, texts bounded. `prefix` names the message
// ("hello." or "response.hello."). INVALID_ARGUMENT naming the field.
absl::Status CheckHelloBounds(const peer_v1::PeerHello& hello, absl::string_view prefix);

// A BeginRemoteTransfer's sizes before anything is planned: tile_bytes in
// [kMinPeerTileBytes, slot_bytes], tiles_total in [1, kMaxPeerTiles], bytes_total at most
// tiles_total * tile_bytes. INVALID_ARGUMENT naming the field.
absl::Status CheckBeginBounds(const peer_v1::BeginRemoteTransferRequest& request,
                              uint64_t slot_bytes);

// `text` cut to kMaxPeerTextBytes (for logs and records of peer-supplied messages).
std::string BoundedPeerText(absl::string_view text);

}  // namespace kvrail::fabric
