#include "daemon/metrics/secure_front.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/unique_fd.h"

namespace kvrail::metrics::internal {
namespace {

constexpr int kIoTimeoutS = 5;
constexpr size_t kMaxRequestBytes = 16 * 1024;
constexpr size_t kMaxPageBytes = 256u << 20;

struct SslCtxFree {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
};
struct SslFree {
  void operator()(SSL* s) const { SSL_free(s); }
};
using SslCtxPtr = std::unique_ptr<SSL_CTX, SslCtxFree>;
using SslPtr = std::unique_ptr<SSL, SslFree>;

std::string SslErrors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "unknown OpenSSL error" : out;
}

absl::StatusOr<SslCtxPtr> MakeContext(const SecureFrontOptions& o) {
  SslCtxPtr ctx(SSL_CTX_new(TLS_server_method()));
  if (ctx == nullptr) return absl::InternalError("metrics_tls: " + SslErrors());
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), o.cert_file.c_str()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_tls.cert_file: cannot use '", o.cert_file, "': ", SslErrors()));
  }
  if (SSL_CTX_use_PrivateKey_file(ctx.get(), o.key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("metrics_tls.key_file: cannot use '", o.key_file,
                                                   "' with the certificate: ", SslErrors()));
  }
  if (!o.client_ca_file.empty()) {
    if (SSL_CTX_load_verify_locations(ctx.get(), o.client_ca_file.c_str(), nullptr) != 1) {
      return absl::InvalidArgumentError(absl::StrCat("metrics_tls.client_ca_file: cannot load '",
                                                     o.client_ca_file, "': ", SslErrors()));
    }
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  return ctx;
}

absl::StatusOr<UniqueFd> Listen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_listen: '", listen, "' is not host:port"));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int e =
          getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
      e != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_listen: cannot resolve '", host, "': ", gai_strerror(e)));
  }
  std::string error = "no address";
  UniqueFd fd;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    UniqueFd s(socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!s.valid()) continue;
    const int one = 1;
    setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(s.get(), a->ai_addr, a->ai_addrlen) == 0 && ::listen(s.get(), 16) == 0) {
      fd = std::move(s);
      break;
    }
    error = std::strerror(errno);
  }
  freeaddrinfo(found);
  if (!fd.valid()) {
    return absl::UnavailableError(
        absl::StrCat("metrics_listen: cannot serve metrics on '", listen, "': ", error));
  }
  return fd;
}

void SetTimeouts(int fd) {
  timeval tv{kIoTimeoutS, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

// One client connection, over TLS or not.
class Conn {
 public:
  Conn(UniqueFd fd, SSL* ssl) : fd_(std::move(fd)), ssl_(ssl) {}
  ~Conn() {
    if (ssl_ != nullptr) SSL_shutdown(ssl_.get());
  }
  int Read(char* buf, int n) {
    return ssl_ ? SSL_read(ssl_.get(), buf, n) : static_cast<int>(::read(fd_.get(), buf, n));
  }
  bool WriteAll(const std::string& data) {
    size_t at = 0;
    while (at < data.size()) {
      const int chunk = static_cast<int>(std::min<size_t>(data.size() - at, 1 << 20));
      const int w = ssl_ ? SSL_write(ssl_.get(), data.data() + at, chunk)
                         : static_cast<int>(::write(fd_.get(), data.data() + at, chunk));
      if (w <= 0) return false;
      at += static_cast<size_t>(w);
    }
    return true;
  }

 private:
  UniqueFd fd_;
  SslPtr ssl_;
};

std::string Response(int code, const char* reason, const std::string& extra_headers,
                     const std::string& body) {
  return absl::StrCat("HTTP/1.1 ", code, " ", reason, "\r\nContent-Type: text/plain\r\n",
                      extra_headers, "Content-Length: ", body.size(),
                      "\r\nConnection: close\r\n\r\n", body);
}

// The value of header `name` (lower case) in `request`'s header lines; empty if absent.
std::string HeaderValue(const std::string& request, const std::string& name) {
  size_t at = request.find("\r\n");
  while (at != std::string::npos && at + 2 < request.size()) {
    const size_t begin = at + 2;
    const size_t end = request.find("\r\n", begin);
    if (end == std::string::npos || end == begin) break;
    const std::string line = request.substr(begin, end - begin);
    const size_t colon = line.find(':');
    if (colon != std::string::npos && absl::AsciiStrToLower(line.substr(0, colon)) == name) {
      return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    }
    at = end;
  }
  return "";
}

// The exposer's page for GET /metrics, as the whole HTTP response.
absl::StatusOr<std::string> FetchBackend(int port, const std::string& authorization) {
  UniqueFd s(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) return absl::InternalError(std::strerror(errno));
  SetTimeouts(s.get());
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    return absl::UnavailableError(std::strerror(errno));
  }
  const std::string request =
      absl::StrCat("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: ", authorization,
                   "\r\nConnection: close\r\n\r\n");
  if (::write(s.get(), request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    return absl::UnavailableError("short write to the exposer");
  }
  std::string page;
  char buf[64 * 1024];
  for (;;) {
    const ssize_t n = ::read(s.get(), buf, sizeof(buf));
    if (n < 0) return absl::UnavailableError(std::strerror(errno));
    if (n == 0) break;
    page.append(buf, static_cast<size_t>(n));
    if (page.size() > kMaxPageBytes) return absl::ResourceExhaustedError("page too large");
  }
  return page;
}

class SecureFrontImpl final : public SecureFront {
 public:
  SecureFrontImpl(SecureFrontOptions options, SslCtxPtr ctx, UniqueFd listener, UniqueFd stop,
                  int port)
      : options_(std::move(options)),
        ctx_(std::move(ctx)),
        listener_(std::move(listener)),
        stop_(std::move(stop)),
        port_(port) {
    thread_ = std::thread([this] { Run(); });
  }
  ~SecureFrontImpl() override {
    const uint64_t one = 1;
    (void)::write(stop_.get(), &one, sizeof(one));
    thread_.join();
  }
  int port() const override { return port_; }

 private:
  void Run() {
    // A client that hangs up mid-write gives EPIPE here, not a SIGPIPE that ends the daemon
    // (a blocked synchronous SIGPIPE stays pending on this thread only; drained below).
    sigset_t pipe_set;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, nullptr);
    for (;;) {
      const timespec zero{0, 0};
      while (sigtimedwait(&pipe_set, nullptr, &zero) > 0) {
      }
      pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
      if (poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[1].revents != 0) return;
      if (fds[0].revents == 0) continue;
      UniqueFd client(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!client.valid()) continue;
      Serve(std::move(client));
    }
  }

  void Serve(UniqueFd client) {
    SetTimeouts(client.get());
    SSL* ssl = nullptr;
    if (ctx_ != nullptr) {
      ssl = SSL_new(ctx_.get());
      if (ssl == nullptr) return;
      SSL_set_fd(ssl, client.get());
      if (SSL_accept(ssl) != 1) {  // plain HTTP, an untrusted client certificate, a timeout
        ERR_clear_error();
        SSL_free(ssl);
        return;
      }
    }
    Conn conn(std::move(client), ssl);
    std::string request;
    char buf[4096];
    while (request.find("\r\n\r\n") == std::string::npos) {
      const int n = conn.Read(buf, sizeof(buf));
      if (n <= 0 || request.size() + static_cast<size_t>(n) > kMaxRequestBytes) {
        ERR_clear_error();
        return;
      }
      request.append(buf, static_cast<size_t>(n));
    }
    const std::string line = request.substr(0, request.find("\r\n"));
    if (!absl::StartsWith(line, "GET /metrics ") && !absl::StartsWith(line, "GET /metrics?")) {
      conn.WriteAll(Response(404, "Not Found", "", "only GET /metrics is served\n"));
      return;
    }
    if (!options_.bearer_token.empty() &&
        !BearerMatches(HeaderValue(request, "authorization"), options_.bearer_token)) {
      conn.WriteAll(Response(401, "Unauthorized", "WWW-Authenticate: Bearer\r\n",
                             "a bearer token is required\n"));
      return;
    }
    absl::StatusOr<std::string> page =
        FetchBackend(options_.backend_port, options_.backend_authorization);
    if (!page.ok()) {
      conn.WriteAll(Response(503, "Service Unavailable", "",
                             absl::StrCat("metrics: ", page.status().message(), "\n")));
      return;
    }
    conn.WriteAll(*page);
    ERR_clear_error();
  }

  const SecureFrontOptions options_;
  const SslCtxPtr ctx_;  // null: plain HTTP
  const UniqueFd listener_;
  const UniqueFd stop_;
  const int port_;
  std::thread thread_;
};

}  // namespace

bool BearerMatches(const std::string& header_value, const std::string& token) {
  if (token.empty() || header_value.size() < 7) return false;
  if (!absl::EqualsIgnoreCase(header_value.substr(0, 7), "bearer ")) return false;
  const std::string given(absl::StripAsciiWhitespace(header_value.substr(7)));
  unsigned char diff = given.size() == token.size() ? 0 : 1;
  for (size_t i = 0; i < token.size(); ++i) {
    diff |= static_cast<unsigned char>(token[i] ^ (i < given.size() ? given[i] : 0));
  }
  return diff == 0;
}

absl::StatusOr<std::unique_ptr<SecureFront>> SecureFront::Start(SecureFrontOptions options) {
  SslCtxPtr ctx;
  if (!options.cert_file.empty()) {
    absl::StatusOr<SslCtxPtr> made = MakeContext(options);
    if (!made.ok()) return made.status();
    ctx = std::move(*made);
  }
  absl::StatusOr<UniqueFd> listener = Listen(options.listen);
  if (!listener.ok()) return listener.status();
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getsockname(listener->get(), reinterpret_cast<sockaddr*>(&addr), &len);
  const int port =
      ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                       : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  UniqueFd stop(eventfd(0, EFD_CLOEXEC));
  if (!stop.valid()) return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  return std::unique_ptr<SecureFront>(std::make_unique<SecureFrontImpl>(
      std::move(options), std::move(ctx), std::move(*listener), std::move(stop), port));
}

}  // namespace kvrail::metrics::internal
