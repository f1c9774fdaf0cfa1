#include "daemon/fabric/peer_auth.h"

#include <grpc/grpc_security_constants.h>
#include <grpcpp/security/auth_context.h>

#include <cctype>
#include <string>

#include "absl/strings/str_cat.h"

namespace kvrail::fabric {

namespace peer_v1 = ::kvrail::peer::v1;

namespace {

bool HasControlCharacters(absl::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return true;
  }
  return false;
}

absl::Status TooLong(absl::string_view prefix, absl::string_view field, size_t size, size_t limit) {
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
    return absl::UnauthenticatedError(
        absl::StrCat("certificate CN: not a node id (1 to ", kMaxNodeIdBytes, " printable bytes)"));
  }
  return cn;
}

std::vector<std::string> CommonNamesOfSubject(absl::string_view subject) {
  std::vector<std::string> names;
  std::string attribute;  // one "type=value", escapes kept
  auto flush = [&names, &attribute] {
    const size_t eq = attribute.find('=');
    if (eq != std::string::npos) {
      std::string type = attribute.substr(0, eq);
      for (char& c : type) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      if (type == "CN" || type == "2.5.4.3" || type == "COMMONNAME") {
        // The value unescaped: "\," is ",", "\XX" a byte in hex.
        std::string value;
        const std::string raw = attribute.substr(eq + 1);
        for (size_t i = 0; i < raw.size(); ++i) {
          if (raw[i] == '\\' && i + 1 < raw.size()) {
            if (i + 2 < raw.size() && std::isxdigit(static_cast<unsigned char>(raw[i + 1])) &&
                std::isxdigit(static_cast<unsigned char>(raw[i + 2]))) {
              value.push_back(static_cast<char>(std::stoi(raw.substr(i + 1, 2), nullptr, 16)));
              i += 2;
            } else {
              value.push_back(raw[++i]);
            }
          } else {
            value.push_back(raw[i]);
          }
        }
        names.push_back(std::move(value));
      }
    }
    attribute.clear();
  };
  for (size_t i = 0; i < subject.size(); ++i) {
    const char c = subject[i];
    if (c == '\\' && i + 1 < subject.size()) {
      attribute.push_back(c);
      attribute.push_back(subject[++i]);
    } else if (c == ',' || c == '+') {
      flush();
    } else {
      attribute.push_back(c);
    }
  }
  flush();
  return names;
}

absl::StatusOr<std::string> NodeIdFromCertificate(const std::vector<std::string>& reported_cns,
                                                  const std::vector<std::string>& subject_cns) {
  if (subject_cns.size() != 1) {
    return absl::UnauthenticatedError(absl::StrCat(
        "certificate CN: the peer certificate must name exactly one node id as its subject "
        "common name, its subject has ",
        subject_cns.size()));
  }
  if (reported_cns.size() != 1 || reported_cns[0] != subject_cns[0]) {
    return absl::UnauthenticatedError(
        "certificate CN: the subject's common name is not the one the TLS library reported");
  }
  return NodeIdFromCommonNames(reported_cns);
}

namespace {

// The node id a verified certificate's AuthContext names.
absl::StatusOr<std::string> NodeIdOf(const grpc::AuthContext& auth) {
  std::vector<std::string> names;
  for (const grpc::string_ref& value : auth.FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME)) {
    names.emplace_back(value.data(), value.size());
  }
  // x509_common_name is only the subject's first CN: the whole subject is counted too.
  const std::vector<grpc::string_ref> subjects =
      auth.FindPropertyValues(GRPC_X509_SUBJECT_PROPERTY_NAME);
  if (subjects.size() != 1) {
    return absl::UnauthenticatedError(
        "certificate CN: the TLS library reported no single subject for the peer certificate");
  }
  return NodeIdFromCertificate(
      names, CommonNamesOfSubject(absl::string_view(subjects[0].data(), subjects[0].size())));
}

}  // namespace

absl::StatusOr<std::string> AuthenticatedNode(const grpc::ServerContext& context) {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) {
    return absl::UnauthenticatedError(
        "peer RPCs are served to peers presenting a certificate (mTLS on tcp_listen) only");
  }
  return NodeIdOf(*auth);
}

absl::Status CheckServerCertificate(const grpc::ClientContext& context, absl::string_view node,
                                    absl::string_view prefix) {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return absl::OkStatus();
  absl::StatusOr<std::string> named = NodeIdOf(*auth);
  if (!named.ok()) {
    return absl::UnauthenticatedError(absl::StrCat(prefix, named.status().message()));
  }
  if (*named != node) {
    return absl::UnauthenticatedError(absl::StrCat(
        prefix, "certificate CN: the server's certificate names '", *named, "', not '", node, "'"));
  }
  return absl::OkStatus();
}

absl::Status CheckClaimedNode(absl::string_view claimed, absl::string_view authenticated,
                              absl::string_view field) {
  if (claimed == authenticated) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat(field, ": '", claimed.substr(0, kMaxNodeIdBytes),
                   "' is not the node this caller's certificate names ('", authenticated, "')"));
}

absl::Status CheckHelloBounds(const peer_v1::PeerHello& hello, absl::string_view prefix) {
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
    return TooLong(prefix, "topology_summary", hello.topology_summary().size(), kMaxPeerTextBytes);
  }
  if (hello.software_version().size() > kMaxPeerTextBytes) {
    return TooLong(prefix, "software_version", hello.software_version().size(), kMaxPeerTextBytes);
  }
  if (hello.nics_size() > kMaxPeerNics) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "nics: ", hello.nics_size(), " NICs, at most ", kMaxPeerNics));
  }
  for (int i = 0; i < hello.nics_size(); ++i) {
    const peer_v1::PeerNic& nic = hello.nics(i);
    const std::string field = absl::StrCat("nics[", i, "].");
    if (nic.name().size() > kMaxPeerTextBytes) {
      return TooLong(prefix, field + "name", nic.name().size(), kMaxPeerTextBytes);
    }
    if (nic.fabric_address().empty() || nic.fabric_address().size() > kMaxFabricAddressBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, field, "fabric_address: ", nic.fabric_address().size(),
                       " bytes, must be 1 to ", kMaxFabricAddressBytes));
    }
  }
  if (hello.your_index() > kMaxPeerIndex) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "your_index: ", hello.your_index(), ", at most ", kMaxPeerIndex));
  }
  return absl::OkStatus();
}

absl::Status CheckBeginBounds(const peer_v1::BeginRemoteTransferRequest& request,
                              uint64_t slot_bytes) {
  if (request.sender_node_id().size() > kMaxNodeIdBytes) {
    return TooLong("", "sender_node_id", request.sender_node_id().size(), kMaxNodeIdBytes);
  }
  if (request.tile_bytes() < kMinPeerTileBytes || request.tile_bytes() > slot_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("tile_bytes: ", request.tile_bytes(),
                                                   " is outside [", kMinPeerTileBytes, ", ",
                                                   slot_bytes, "] (fabric.slot_bytes)"));
  }
  if (request.tiles_total() == 0 || request.tiles_total() > kMaxPeerTiles) {
    return absl::InvalidArgumentError(absl::StrCat("tiles_total: ", request.tiles_total(),
                                                   " is outside [1, ", kMaxPeerTiles, "]"));
  }
  // tiles_total * tile_bytes cannot overflow: 2^20 * 2^30 at most.
  if (request.bytes_total() > uint64_t{request.tiles_total()} * request.tile_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("bytes_total: ", request.bytes_total(),
                                                   " is more than tiles_total x tile_bytes"));
  }
  return absl::OkStatus();
}

std::string BoundedPeerText(absl::string_view text) {
  if (text.size() <= kMaxPeerTextBytes) return std::string(text);
  return absl::StrCat(text.substr(0, kMaxPeerTextBytes), "... (", text.size(), " bytes)");
}

}  // namespace kvrail::fabric
