#include "daemon/directory/etcd_test_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/directory/etcd_client.h"

namespace kvrail::directory::testing {
namespace {

int FreePort(const std::string& host) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  int port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

}  // namespace

std::string EtcdBinaryOrEmpty() {
  const char* env = std::getenv("KVRAIL_ETCD_BIN");
  const std::string path = env != nullptr ? env : "/usr/bin/etcd";
  return ::access(path.c_str(), X_OK) == 0 ? path : "";
}

EtcdTestServer::EtcdTestServer(const std::string& host) : host_(host) {
  char tmpl[] = "/tmp/kvrail-etcd-XXXXXX";
  if (const char* dir = ::mkdtemp(tmpl)) dir_ = dir;
  client_port_ = FreePort(host_);
  peer_port_ = FreePort(host_);
}

EtcdTestServer::~EtcdTestServer() {
  Kill();
  std::error_code ignored;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
}

std::string EtcdTestServer::endpoint() const { return absl::StrCat(host_, ":", client_port_); }

absl::Status EtcdTestServer::Start() {
  const std::string binary = EtcdBinaryOrEmpty();
  if (binary.empty()) {
    return absl::FailedPreconditionError(
        "no etcd binary ($KVRAIL_ETCD_BIN or /usr/bin/etcd): install Debian's etcd-server "
        "(deploy/dev.sh setup does)");
  }
  if (dir_.empty() || client_port_ == 0 || peer_port_ == 0) {
    return absl::InternalError("etcd test server: no temp dir or free port");
  }
  const std::string client = absl::StrCat("http://", host_, ":", client_port_);
  const std::string peer = absl::StrCat("http://", host_, ":", peer_port_);
  std::vector<std::string> args = {binary,
                                   "--name",
                                   "kvrail-test",
                                   "--data-dir",
                                   dir_ + "/data",
                                   "--listen-client-urls",
                                   client,
                                   "--advertise-client-urls",
                                   client,
                                   "--listen-peer-urls",
                                   peer,
                                   "--initial-advertise-peer-urls",
                                   peer,
                                   "--initial-cluster",
                                   absl::StrCat("kvrail-test=", peer)};
  const std::string log = dir_ + "/etcd.log";
  pid_ = ::fork();
  if (pid_ < 0) return absl::InternalError("fork failed");
  if (pid_ == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  EtcdClientOptions options;
  options.endpoints = {endpoint()};
  options.call_timeout = absl::Seconds(1);
  absl::StatusOr<std::unique_ptr<EtcdClient>> client_or = CreateGrpcEtcdClient(options);
  if (!client_or.ok()) return client_or.status();
  const absl::Time until = absl::Now() + absl::Seconds(20);
  absl::Status last;
  while (absl::Now() < until) {
    int status;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::InternalError(absl::StrCat("etcd exited at start; its log:\n", ReadLog()));
    }
    absl::StatusOr<EtcdRange> range = (*client_or)->RangePrefix("/");
    // With authentication enabled (`etcdctl auth enable`), etcd answers a call without a token
    // "user name is empty": it is up.
    if (range.ok() || absl::StrContains(range.status().message(), "user name is empty")) {
      return absl::OkStatus();
    }
    last = range.status();
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("etcd did not answer within 20 s: ", last.ToString(), "\n", ReadLog()));
}

void EtcdTestServer::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

std::string EtcdTestServer::ReadLog() const {
  std::ifstream in(dir_ + "/etcd.log");
  std::stringstream s;
  s << in.rdbuf();
  const std::string text = s.str();
  return text.size() > 4000 ? text.substr(text.size() - 4000) : text;
}

}  // namespace kvrail::directory::testing
