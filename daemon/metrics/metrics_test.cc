#define CATCH_CONFIG_MAIN
#include <arpa/inet.h>
#include <catch2/catch.hpp>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "daemon/metrics/metrics.h"

namespace kvrail::metrics {
namespace {

// A plain HTTP/1.0 GET on loopback; returns the whole response.
std::string HttpGet(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  REQUIRE(::write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size()));
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
  ::close(fd);
  return out;
}

TEST_CASE("metrics count ended transfers and read gauges from stats at scrape time") {
  int scrapes = 0;
  auto m = Metrics::Start("127.0.0.1:0", [&] {
    ++scrapes;
    v1::Stats s;
    s.set_regions(3);
    s.set_transfers_active(2);
    (*s.mutable_queued_tiles())["critical"] = 5;
    s.add_engines("host: 4 threads");
    return s;
  });
  REQUIRE(m.ok());
  REQUIRE((*m)->port() > 0);
  v1::TransferStatus t;
  t.set_path(v1::PATH_HOST_LOCAL);
  t.mutable_spec()->set_priority(v1::PRIORITY_CRITICAL);
  t.set_state(v1::TRANSFER_STATE_SUCCEEDED);
  t.set_bytes_done(4096);
  t.set_submitted_unix_us(1000);
  t.set_finished_unix_us(1300);
  (*m)->OnTransferFinished(t);
  (*m)->OnTransferFinished(t);
  t.set_state(v1::TRANSFER_STATE_FAILED);
  t.set_bytes_done(0);
  (*m)->OnTransferFinished(t);
  const std::string body = HttpGet((*m)->port(), "/metrics");
  INFO(body);
  CHECK(body.find("200 OK") != std::string::npos);
  CHECK(body.find(R"(kvrail_transfers_total{path="host_local",priority="critical",result="succeeded"} 2)") != std::string::npos);
  CHECK(body.find(R"(kvrail_transfers_total{path="host_local",priority="critical",result="failed"} 1)") != std::string::npos);
  CHECK(body.find(R"(kvrail_bytes_total{path="host_local",priority="critical"} 8192)") != std::string::npos);
  CHECK(body.find(R"(kvrail_transfer_duration_seconds_count{path="host_local",priority="critical"} 3)") != std::string::npos);
  CHECK(body.find(R"(kvrail_transfer_duration_seconds_bucket{path="host_local",priority="critical",le="0.0005"} 3)") != std::string::npos);
  CHECK(body.find("kvrail_regions 3") != std::string::npos);
  CHECK(body.find(R"(kvrail_queued_tiles{priority="critical"} 5)") != std::string::npos);
  CHECK(scrapes == 1);
}

TEST_CASE("a busy metrics address is an error naming the key") {
  auto first = Metrics::Start("127.0.0.1:0", [] { return v1::Stats(); });
  REQUIRE(first.ok());
  auto second = Metrics::Start("127.0.0.1:" + std::to_string((*first)->port()), [] { return v1::Stats(); });
  REQUIRE(!second.ok());
  CHECK(std::string(second.status().message()).rfind("metrics_listen:", 0) == 0);
}

}  // namespace
}  // namespace kvrail::metrics
