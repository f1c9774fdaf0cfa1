// Internal to daemon/metrics: the metrics endpoint's TLS and bearer-token front (metrics.h:
// MetricsOptions.tls_*, bearer_token). prometheus-cpp's server (civetweb) has no bearer tokens and
// would load OpenSSL by the development library's name (libssl.so), so the front terminates TLS
// itself with OpenSSL and checks the token, then asks the plain exposer, which listens on
// 127.0.0.1 only and answers only requests carrying a per-process secret (HTTP basic auth), for
// the page and sends it back. Only GET /metrics is served.
//
// Thread contract: Start and the destructor from one thread; the front's own thread serves the
// connections one after another (a scrape is one short request; each socket read and write has a
// 5 s timeout, so a stalled client delays the others by at most that).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace kvrail::metrics::internal {

struct SecureFrontOptions {
  // host:port to listen on (port 0 picks one).
  std::string listen;
  // PEM files; cert_file empty: plain HTTP (with the token check).
  std::string cert_file;
  std::string key_file;
  // PEM CA file: clients must present a certificate it signed (mTLS). Empty: not asked.
  std::string client_ca_file;
  // Non-empty: requests need "Authorization: Bearer <bearer_token>".
  std::string bearer_token;
  // The plain exposer on 127.0.0.1, and the Authorization header value it wants.
  int backend_port = 0;
  std::string backend_authorization;
};

class SecureFront {
 public:
  static absl::StatusOr<std::unique_ptr<SecureFront>> Start(SecureFrontOptions options);
  virtual ~SecureFront() = default;
  virtual int port() const = 0;
};

// Whether `header_value` (an Authorization header's value) carries `token` as a bearer token
// (scheme case-insensitive; compared in constant time).
bool BearerMatches(const std::string& header_value, const std::string& token);

}  // namespace kvrail::metrics::internal
