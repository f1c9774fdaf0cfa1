#include "daemon/fabric/peer_auth.h"

#include <grpc/grpc_security_constants.h>
#include <grpcpp/security/auth_context.h>

#include "absl/strings/str_cat.h"

namespace kvrail::fabric {
namespace {

bool HasControlCharacters(absl::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return true;
  }
  return false;
}

absl::Status TooLong(absl::string_view prefix, absl::string_view field, size_t size,
                     size_t limit) {
  return absl::InvalidArgumentError(
      absl::StrCat(prefix, field, ": ", size, " bytes, at most ", limit));
}

}  // namespace

absl::StatusOr<std::string> NodeIdFromCommonNames(const std::vector<std::string>& common_names) {
  if (common_names.size() != 1) {
    return absl::UnauthenticatedError(absl::StrCat(
        "certificate CN: the peer certificate must name exactly one node id as its subject "
        "common name, it has ",
        common_names.size()));
  }
  const std::string& cn = common_names[0];
  if (cn.empty() || cn.size() > kMaxNodeIdBytes || HasControlCharacters(cn)) {
    return absl::UnauthenticatedError(absl::StrCat(
        "certificate CN: not a node id (1 to ", kMaxNodeIdBytes,
        " printable bytes)"));
  }
  return cn;
}

absl::StatusOr<std::string> AuthenticatedNode(const grpc::ServerContext& context) {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) {
    return absl::UnauthenticatedError(
        "peer RPCs are served to peers presenting a certificate (mTLS on tcp_listen) only");
  }
  std::vector<std::string> names;
  for (const grpc::string_ref& value : auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME)) {
    names.emplace_back(value.data(), value.size());
  }
  return NodeIdFromCommonNames(names);
}

absl::Status CheckClaimedNode(absl::string_view claimed, absl::string_view authenticated,
                              absl::string_view field) {
  if (claimed == authenticated) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      field, ": '", claimed.substr(0, kMaxNodeIdBytes),
      "' is not the node this caller's certificate names ('", authenticated, "')"));
}

absl::Status CheckHelloBounds(const v1::PeerHello& hello, absl::string_view prefix) {
  if (hello.node_id().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "node_id: empty"));
  }
  if (hello.node_id().size() > kMaxNodeIdBytes) {
    return TooLong(prefix, "node_id", hello.node_id().size(), kMaxNodeIdBytes);
  }
  if (hello.provider().size() > kMaxPeerTextBytes) {
    return TooLong(prefix, "provider", hello.provider().size(), kMaxPeerTextBytes);
  }
  if (hello.topology_summary().size() > kMaxPeerTextBytes) {
    return TooLong(prefix, "topology_summary", hello.topology_summary().size(),
                   kMaxPeerTextBytes);
  }
  if (hello.software_version().size() > kMaxPeerTextBytes) {
    return TooLong(prefix, "software_version", hello.software_version().size(),
                   kMaxPeerTextBytes);
  }
  if (hello.nics_size() > kMaxPeerNics) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "nics: ", hello.nics_size(), " NICs, at most ", kMaxPeerNics));
  }
  for (int i = 0; i < hello.nics_size(); ++i) {
    const v1::PeerNic& nic = hello.nics(i);
    const std::string field = absl::StrCat("nics[", i, "].");
    if (nic.name().size() > kMaxPeerTextBytes) {
      return TooLong(prefix, field + "name", nic.name().size(), kMaxPeerTextBytes);
    }
    if (nic.fabric_address().empty() || nic.fabric_address().size() > kMaxFabricAddressBytes) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, field, "fabric_address: ",
                                                     nic.fabric_address().size(),
                                                     " bytes, must be 1 to ",
                                                     kMaxFabricAddressBytes));
    }
  }
  if (hello.your_index() > kMaxPeerIndex) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "your_index: ", hello.your_index(),
                                                   ", at most ", kMaxPeerIndex));
  }
  return absl::OkStatus();
}

absl::Status CheckBeginBounds(const v1::BeginRemoteTransferRequest& request,
                              uint64_t slot_bytes) {
  if (request.sender_node_id().size() > kMaxNodeIdBytes) {
    return TooLong("", "sender_node_id", request.sender_node_id().size(), kMaxNodeIdBytes);
  }
  if (request.tile_bytes() < kMinPeerTileBytes || request.tile_bytes() > slot_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tile_bytes: ", request.tile_bytes(), " is outside [", kMinPeerTileBytes, ", ",
        slot_bytes, "] (fabric.slot_bytes)"));
  }
  if (request.tiles_total() == 0 || request.tiles_total() > kMaxPeerTiles) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tiles_total: ", request.tiles_total(), " is outside [1, ", kMaxPeerTiles, "]"));
  }
  // tiles_total * tile_bytes cannot overflow: 2^20 * 2^30 at most.
  if (request.bytes_total() > uint64_t{request.tiles_total()} * request.tile_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bytes_total: ", request.bytes_total(), " is more than tiles_total x tile_bytes"));
  }
  return absl::OkStatus();
}

std::string BoundedPeerText(absl::string_view text) {
  if (text.size() <= kMaxPeerTextBytes) return std::string(text);
  return absl::StrCat(text.substr(0, kMaxPeerTextBytes), "... (", text.size(), " bytes)");
}

}  // namespace kvrail::fabric
