// The metrics endpoint over TLS and with a bearer token (daemon/metrics: MetricsOptions.tls_*,
// bearer_token; DaemonConfig.metrics_tls, metrics_bearer_token_file): a scraper that trusts a CA
// the test makes with openssl gets the page with the right token, 401 with none or a wrong one;
// plain HTTP on that port gets nothing; a scraper trusting another CA fails the handshake; with
// client_ca_file a scraper without a client certificate is refused and one with a certificate
// the CA signed is served.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "daemon/metrics/metrics.h"
#include "tests/harness/daemon_process.h"
#include "tests/tls/test_ca.h"

namespace kvrail {
namespace {

struct Scrape {
  bool handshake = false;  // the TLS handshake (with the CA's verification) succeeded
  std::string response;
};

// GET /metrics over TLS, trusting `ca_file`; `token` (non-empty) as a bearer token; a client
// certificate when `cert_file` is set.
Scrape TlsGet(int port, const std::string& ca_file, const std::string& token,
              const std::string& cert_file = "", const std::string& key_file = "") {
  Scrape out;
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  REQUIRE(ctx != nullptr);
  REQUIRE(SSL_CTX_load_verify_locations(ctx, ca_file.c_str(), nullptr) == 1);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  if (!cert_file.empty()) {
    REQUIRE(SSL_CTX_use_certificate_file(ctx, cert_file.c_str(), SSL_FILETYPE_PEM) == 1);
    REQUIRE(SSL_CTX_use_PrivateKey_file(ctx, key_file.c_str(), SSL_FILETYPE_PEM) == 1);
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  SSL* ssl = SSL_new(ctx);
  SSL_set_fd(ssl, fd);
  if (SSL_connect(ssl) == 1) {
    out.handshake = true;
    std::string request = "GET /metrics HTTP/1.1\r\nHost: localhost\r\n";
    if (!token.empty()) request += "Authorization: Bearer " + token + "\r\n";
    request += "\r\n";
    if (SSL_write(ssl, request.data(), static_cast<int>(request.size())) > 0) {
      char buf[4096];
      int n;
      while ((n = SSL_read(ssl, buf, sizeof(buf))) > 0) out.response.append(buf, n);
    }
  }
  ERR_clear_error();
  SSL_free(ssl);
  ::close(fd);
  SSL_CTX_free(ctx);
  return out;
}

v1::Stats SomeStats() {
  v1::Stats s;
  s.set_version("test");
  return s;
}

bool Served(const std::string& response) {
  return response.rfind("HTTP/1.1 200", 0) == 0 &&
         response.find("kvrail_start_time_seconds") != std::string::npos;
}

}  // namespace

TEST_CASE("metrics over TLS with a bearer token: served to the right scraper only") {
  testing::TestCa ca("metrics");
  REQUIRE(ca.status().ok());
  absl::StatusOr<testing::TestCa::Issued> server = ca.Issue("kvraild-metrics");
  REQUIRE(server.ok());
  testing::TestCa other("other");
  REQUIRE(other.status().ok());

  metrics::MetricsOptions o;
  o.listen = "127.0.0.1:0";
  o.stats = SomeStats;
  o.tls_cert_file = server->cert_file;
  o.tls_key_file = server->key_file;
  o.bearer_token = "s3cret-token";
  absl::StatusOr<std::unique_ptr<metrics::Metrics>> m = metrics::Metrics::Start(std::move(o));
  REQUIRE(m.ok());
  const int port = (*m)->port();
  REQUIRE(port > 0);

  const Scrape ok = TlsGet(port, ca.ca_file(), "s3cret-token");
  CHECK(ok.handshake);
  CHECK(Served(ok.response));

  const Scrape wrong = TlsGet(port, ca.ca_file(), "s3cret-tokeN");
  CHECK(wrong.handshake);
  CHECK(wrong.response.rfind("HTTP/1.1 401", 0) == 0);
  CHECK(wrong.response.find("kvrail_") == std::string::npos);
  const Scrape none = TlsGet(port, ca.ca_file(), "");
  CHECK(none.response.rfind("HTTP/1.1 401", 0) == 0);

  // Plain HTTP on the TLS port: no page.
  const std::string plain = testing::HttpGet(port, "/metrics");
  CHECK(plain.find("200") == std::string::npos);
  CHECK(plain.find("kvrail_") == std::string::npos);

  // A scraper that trusts another CA does not accept the endpoint's certificate.
  const Scrape untrusted = TlsGet(port, other.ca_file(), "s3cret-token");
  CHECK_FALSE(untrusted.handshake);
  CHECK(untrusted.response.empty());
}

TEST_CASE("metrics over TLS with client certificates (mTLS)") {
  testing::TestCa ca("metrics-mtls");
  REQUIRE(ca.status().ok());
  absl::StatusOr<testing::TestCa::Issued> server = ca.Issue("kvraild-metrics");
  absl::StatusOr<testing::TestCa::Issued> scraper = ca.Issue("prometheus");
  REQUIRE(server.ok());
  REQUIRE(scraper.ok());
  testing::TestCa other("mtls-other");
  REQUIRE(other.status().ok());
  absl::StatusOr<testing::TestCa::Issued> stranger = other.Issue("prometheus");
  REQUIRE(stranger.ok());

  metrics::MetricsOptions o;
  o.listen = "127.0.0.1:0";
  o.stats = SomeStats;
  o.tls_cert_file = server->cert_file;
  o.tls_key_file = server->key_file;
  o.tls_client_ca_file = ca.ca_file();
  absl::StatusOr<std::unique_ptr<metrics::Metrics>> m = metrics::Metrics::Start(std::move(o));
  REQUIRE(m.ok());
  const int port = (*m)->port();

  CHECK(Served(TlsGet(port, ca.ca_file(), "", scraper->cert_file, scraper->key_file).response));
  CHECK_FALSE(Served(TlsGet(port, ca.ca_file(), "").response));
  CHECK_FALSE(
      Served(TlsGet(port, ca.ca_file(), "", stranger->cert_file, stranger->key_file).response));
}

TEST_CASE("a bearer token without TLS; plain metrics unchanged") {
  metrics::MetricsOptions o;
  o.listen = "127.0.0.1:0";
  o.stats = SomeStats;
  o.bearer_token = "t0ken";
  absl::StatusOr<std::unique_ptr<metrics::Metrics>> m = metrics::Metrics::Start(std::move(o));
  REQUIRE(m.ok());
  CHECK(testing::HttpGet((*m)->port(), "/metrics").find("HTTP/1.1 401") == 0);

  metrics::MetricsOptions plain;
  plain.listen = "127.0.0.1:0";
  plain.stats = SomeStats;
  absl::StatusOr<std::unique_ptr<metrics::Metrics>> p = metrics::Metrics::Start(std::move(plain));
  REQUIRE(p.ok());
  CHECK(testing::HttpGet((*p)->port(), "/metrics").find("kvrail_start_time_seconds") !=
        std::string::npos);
}

TEST_CASE("bad TLS options are errors naming the field") {
  testing::TestCa ca("metrics-bad");
  REQUIRE(ca.status().ok());
  absl::StatusOr<testing::TestCa::Issued> server = ca.Issue("kvraild-metrics");
  REQUIRE(server.ok());
  metrics::MetricsOptions o;
  o.listen = "127.0.0.1:0";
  o.stats = SomeStats;
  o.tls_cert_file = server->cert_file;  // no key
  absl::StatusOr<std::unique_ptr<metrics::Metrics>> m = metrics::Metrics::Start(o);
  REQUIRE_FALSE(m.ok());
  CHECK(std::string(m.status().message()).find("metrics_tls") != std::string::npos);
  o.tls_key_file = ca.ca_file();  // not the certificate's key
  m = metrics::Metrics::Start(o);
  REQUIRE_FALSE(m.ok());
  CHECK(std::string(m.status().message()).find("metrics_tls.key_file") != std::string::npos);
  o.tls_key_file = server->key_file;
  o.tls_cert_file = "/nonexistent/cert.pem";
  m = metrics::Metrics::Start(o);
  REQUIRE_FALSE(m.ok());
  CHECK(std::string(m.status().message()).find("metrics_tls.cert_file") != std::string::npos);
}

}  // namespace kvrail
