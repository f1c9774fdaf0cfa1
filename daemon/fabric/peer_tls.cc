#include "daemon/fabric/peer_tls.h"

#include <grpcpp/create_channel.h>

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace kvrail::fabric {
namespace {

// The PEM text of `path` (config key `key`), which must hold a `what` block.
absl::StatusOr<std::string> ReadPem(const std::string& path, const std::string& key,
                                    const std::string& what) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(key, ": not set"));
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(key, ": cannot read '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  if (!absl::StrContains(text.str(), "-----BEGIN") || !absl::StrContains(text.str(), what)) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, ": '", path, "' holds no PEM ", what, " block"));
  }
  return text.str();
}

}  // namespace

absl::StatusOr<std::shared_ptr<const PeerTlsPem>> LoadPeerTls(const v1::PeerTls& files) {
  auto pem = std::make_shared<PeerTlsPem>();
  KVRAIL_ASSIGN_OR_RETURN(pem->ca, ReadPem(files.ca_file(), "peer_tls.ca_file", "CERTIFICATE"));
  KVRAIL_ASSIGN_OR_RETURN(pem->cert,
                          ReadPem(files.cert_file(), "peer_tls.cert_file", "CERTIFICATE"));
  KVRAIL_ASSIGN_OR_RETURN(pem->key, ReadPem(files.key_file(), "peer_tls.key_file", "PRIVATE KEY"));
  return std::shared_ptr<const PeerTlsPem>(std::move(pem));
}

std::shared_ptr<grpc::ServerCredentials> PeerServerCredentials(
    const std::shared_ptr<const PeerTlsPem>& tls) {
  if (tls == nullptr) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = tls->ca;
  options.pem_key_cert_pairs.push_back({tls->key, tls->cert});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::Channel> PeerChannel(const std::string& address, const std::string& node_id,
                                           const std::shared_ptr<const PeerTlsPem>& tls,
                                           grpc::ChannelArguments args) {
  if (tls == nullptr) {
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  }
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = tls->ca;
  options.pem_private_key = tls->key;
  options.pem_cert_chain = tls->cert;
  // The server's certificate must name the node we mean to call (its CN, or a DNS SAN), not
  // the address we reach it at.
  args.SetSslTargetNameOverride(node_id);
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(options), args);
}

}  // namespace kvrail::fabric
