// The etcd client's user/password authentication against an in-process fake of etcd's gRPC
// services (loopback, port 0) that answers as etcd 3.4 does: Auth.Authenticate hands out tokens,
// KV/Lease/Watch calls need one in their "token" metadata, and a token the fake forgets (as etcd
// does when a simple token expires or the member restarts) is refused with "etcdserver: invalid
// auth token" - the client authenticates again and retries once. A wrong password is refused
// naming etcd.username and etcd.password_file, never echoing the password.
#include <grpcpp/grpcpp.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/directory/etcd_client.h"
#include "proto/etcd/rpc.grpc.pb.h"

namespace kvrail::directory {
namespace {

constexpr char kUser[] = "kvrail";
constexpr char kPassword[] = "s3cret-Pw-9f1";

// etcd's checks and texts (rpctypes): no token, an unknown token. Thread-safe.
class TokenBook {
 public:
  grpc::Status Check(grpc::ServerContext* context) {
    const auto& metadata = context->client_metadata();
    auto it = metadata.find("token");
    absl::MutexLock lock(&mu_);
    ++calls_;
    if (it == metadata.end()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "etcdserver: user name is empty");
    }
    if (valid_.count(std::string(it->second.data(), it->second.size())) == 0) {
      ++refused_;
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "etcdserver: invalid auth token");
    }
    return grpc::Status::OK;
  }
  grpc::Status Authenticate(const etcdserverpb::AuthenticateRequest& request,
                            etcdserverpb::AuthenticateResponse* response) {
    absl::MutexLock lock(&mu_);
    ++authentications_;
    if (request.name() != kUser || request.password() != kPassword) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "etcdserver: authentication failed, invalid user ID or password");
    }
    const std::string token = absl::StrCat("simple-token.", ++issued_);
    valid_.insert(token);
    response->set_token(token);
    return grpc::Status::OK;
  }
  // Every token issued so far stops being valid (etcd restarted, or they expired).
  void ForgetAll() {
    absl::MutexLock lock(&mu_);
    valid_.clear();
  }
  int authentications() {
    absl::MutexLock lock(&mu_);
    return authentications_;
  }
  int refused() {
    absl::MutexLock lock(&mu_);
    return refused_;
  }

 private:
  absl::Mutex mu_;
  std::set<std::string> valid_ ABSL_GUARDED_BY(mu_);
  int issued_ ABSL_GUARDED_BY(mu_) = 0;
  int authentications_ ABSL_GUARDED_BY(mu_) = 0;
  int refused_ ABSL_GUARDED_BY(mu_) = 0;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

class FakeAuth final : public etcdserverpb::Auth::Service {
 public:
  explicit FakeAuth(TokenBook* book) : book_(book) {}
  grpc::Status Authenticate(grpc::ServerContext*, const etcdserverpb::AuthenticateRequest* request,
                            etcdserverpb::AuthenticateResponse* response) override {
    return book_->Authenticate(*request, response);
  }

 private:
  TokenBook* const book_;
};

class FakeKv final : public etcdserverpb::KV::Service {
 public:
  explicit FakeKv(TokenBook* book) : book_(book) {}
  grpc::Status Range(grpc::ServerContext* context, const etcdserverpb::RangeRequest* request,
                     etcdserverpb::RangeResponse* response) override {
    if (grpc::Status s = book_->Check(context); !s.ok()) return s;
    response->mutable_header()->set_revision(42);
    mvccpb::KeyValue* kv = response->add_kvs();
    kv->set_key(request->key() + "n1");
    kv->set_value("record");
    return grpc::Status::OK;
  }
  grpc::Status Put(grpc::ServerContext* context, const etcdserverpb::PutRequest*,
                   etcdserverpb::PutResponse* response) override {
    if (grpc::Status s = book_->Check(context); !s.ok()) return s;
    response->mutable_header()->set_revision(43);
    return grpc::Status::OK;
  }

 private:
  TokenBook* const book_;
};

class FakeLease final : public etcdserverpb::Lease::Service {
 public:
  explicit FakeLease(TokenBook* book) : book_(book) {}
  grpc::Status LeaseGrant(grpc::ServerContext* context, const etcdserverpb::LeaseGrantRequest*,
                          etcdserverpb::LeaseGrantResponse* response) override {
    if (grpc::Status s = book_->Check(context); !s.ok()) return s;
    response->set_id(7);
    response->set_ttl(10);
    return grpc::Status::OK;
  }
  grpc::Status LeaseKeepAlive(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<etcdserverpb::LeaseKeepAliveResponse,
                               etcdserverpb::LeaseKeepAliveRequest>* stream) override {
    if (grpc::Status s = book_->Check(context); !s.ok()) return s;
    etcdserverpb::LeaseKeepAliveRequest request;
    while (stream->Read(&request)) {
      etcdserverpb::LeaseKeepAliveResponse response;
      response.set_id(request.id());
      response.set_ttl(10);
      if (!stream->Write(response)) break;
    }
    return grpc::Status::OK;
  }

 private:
  TokenBook* const book_;
};

// As etcd 3.4: a watch whose token does not check out is cancelled at creation with "permission
// denied" on a stream that stays open.
class FakeWatch final : public etcdserverpb::Watch::Service {
 public:
  explicit FakeWatch(TokenBook* book) : book_(book) {}
  grpc::Status Watch(grpc::ServerContext* context,
                     grpc::ServerReaderWriter<etcdserverpb::WatchResponse,
                                              etcdserverpb::WatchRequest>* stream) override {
    const bool allowed = book_->Check(context).ok();
    etcdserverpb::WatchRequest request;
    while (stream->Read(&request)) {
      etcdserverpb::WatchResponse response;
      response.set_created(true);
      if (!allowed) {
        response.set_watch_id(-1);
        response.set_canceled(true);
        response.set_cancel_reason("etcdserver: permission denied");
      }
      if (!stream->Write(response)) break;
    }
    return grpc::Status::OK;
  }

 private:
  TokenBook* const book_;
};

struct FakeEtcd {
  FakeEtcd() : auth(&book), kv(&book), lease(&book), watch(&book) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&auth);
    builder.RegisterService(&kv);
    builder.RegisterService(&lease);
    builder.RegisterService(&watch);
    server = builder.BuildAndStart();
    REQUIRE(server != nullptr);
    REQUIRE(port > 0);
  }
  ~FakeEtcd() { server->Shutdown(std::chrono::system_clock::now()); }
  std::string endpoint() const { return absl::StrCat("127.0.0.1:", port); }

  TokenBook book;
  FakeAuth auth;
  FakeKv kv;
  FakeLease lease;
  FakeWatch watch;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

std::unique_ptr<EtcdClient> Connect(const FakeEtcd& etcd, const std::string& user,
                                    const std::string& password) {
  EtcdClientOptions options;
  options.endpoints = {etcd.endpoint()};
  options.username = user;
  options.password = password;
  options.call_timeout = absl::Seconds(5);
  auto client = CreateGrpcEtcdClient(options);
  REQUIRE(client.ok());
  return *std::move(client);
}

TEST_CASE("the client authenticates once and sends its token on KV, Lease and Watch calls") {
  FakeEtcd etcd;
  auto client = Connect(etcd, kUser, kPassword);
  auto range = client->RangePrefix("/kvrail/");
  INFO(range.status().ToString());
  REQUIRE(range.ok());
  CHECK(range->revision == 42);
  CHECK(client->Put("/kvrail/a", "x", 0).ok());
  auto lease = client->LeaseGrant(10);
  REQUIRE(lease.ok());
  CHECK(client->LeaseKeepAlive(*lease).ok());
  auto watch = client->WatchPrefix("/kvrail/", 43);
  INFO(watch.status().ToString());
  CHECK(watch.ok());
  CHECK(etcd.book.authentications() == 1);
  CHECK(etcd.book.refused() == 0);
}

TEST_CASE("a token etcd no longer knows is renewed and the call retried, once per refusal") {
  FakeEtcd etcd;
  auto client = Connect(etcd, kUser, kPassword);
  REQUIRE(client->RangePrefix("/kvrail/").ok());
  REQUIRE(etcd.book.authentications() == 1);
  // etcd restarted (simple tokens live in the member's memory) or the token expired.
  etcd.book.ForgetAll();
  auto range = client->RangePrefix("/kvrail/");
  INFO(range.status().ToString());
  CHECK(range.ok());
  CHECK(etcd.book.refused() == 1);
  CHECK(etcd.book.authentications() == 2);
  // The same for the streams: a keep-alive and a watch (refused at creation, "permission denied").
  etcd.book.ForgetAll();
  CHECK(client->LeaseKeepAlive(7).ok());
  CHECK(etcd.book.authentications() == 3);
  etcd.book.ForgetAll();
  auto watch = client->WatchPrefix("/kvrail/", 43);
  INFO(watch.status().ToString());
  CHECK(watch.ok());
  CHECK(etcd.book.authentications() == 4);
  // Calls in between reuse the token.
  CHECK(client->Put("/kvrail/a", "x", 0).ok());
  CHECK(client->RangePrefix("/kvrail/").ok());
  CHECK(etcd.book.authentications() == 4);
}

TEST_CASE("a wrong password is refused naming the config keys, never echoing the password") {
  FakeEtcd etcd;
  const std::string wrong = "not-the-Pw-77";
  auto client = Connect(etcd, kUser, wrong);
  auto range = client->RangePrefix("/kvrail/");
  REQUIRE_FALSE(range.ok());
  const std::string message(range.status().message());
  INFO(message);
  CHECK(range.status().code() == absl::StatusCode::kUnauthenticated);
  CHECK(message.find("etcd.username 'kvrail'") != std::string::npos);
  CHECK(message.find("etcd.password_file") != std::string::npos);
  CHECK(message.find("invalid user ID or password") != std::string::npos);
  CHECK(message.find(wrong) == std::string::npos);
  CHECK(message.find(kPassword) == std::string::npos);
  // Every call tries again (the password file may be fixed by a restart only, but etcd's user
  // may be created later): nothing is cached from a refusal.
  CHECK_FALSE(client->Put("/kvrail/a", "x", 0).ok());
  CHECK(etcd.book.authentications() == 2);
}

TEST_CASE("without etcd.username an etcd with authentication says which keys to set") {
  FakeEtcd etcd;
  EtcdClientOptions options;
  options.endpoints = {etcd.endpoint()};
  auto client = CreateGrpcEtcdClient(options);
  REQUIRE(client.ok());
  auto range = (*client)->RangePrefix("/kvrail/");
  REQUIRE_FALSE(range.ok());
  INFO(range.status().ToString());
  CHECK(std::string(range.status().message()).find("set etcd.username and etcd.password_file") !=
        std::string::npos);
  CHECK(etcd.book.authentications() == 0);
  // A user without a password (or the reverse) is refused when the client is made.
  options.username = kUser;
  CHECK(CreateGrpcEtcdClient(options).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("the password file: its first line; unreadable or empty refused naming the key") {
  char path[] = "/tmp/kvrail-etcd-pw-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::close(fd);
  {
    std::ofstream out(path);
    out << kPassword << "\r\nsecond line\n";
  }
  auto read = ReadEtcdPasswordFile(path);
  REQUIRE(read.ok());
  CHECK(*read == kPassword);
  {
    std::ofstream out(path);
    out << "\n";
  }
  read = ReadEtcdPasswordFile(path);
  CHECK(read.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(read.status().message()).rfind("etcd.password_file: ", 0) == 0);
  std::remove(path);
  read = ReadEtcdPasswordFile(path);
  CHECK(read.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(read.status().message()).rfind("etcd.password_file: cannot read", 0) == 0);
}

// What ReadEtcdPasswordFile(path) logs (the default logger, captured for the call).
std::string LoggedReading(const std::string& path) {
  std::ostringstream log;
  const std::shared_ptr<spdlog::logger> before = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "etcd_pw_test", std::make_shared<spdlog::sinks::ostream_sink_mt>(log)));
  const auto read = ReadEtcdPasswordFile(path);
  spdlog::set_default_logger(before);
  CHECK(read.ok());
  return log.str();
}

TEST_CASE("the password file: a warning (never the password) when group or others may read it") {
  char path[] = "/tmp/kvrail-etcd-pw-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::close(fd);
  {
    std::ofstream out(path);
    out << kPassword << "\n";
  }
  REQUIRE(::chmod(path, 0600) == 0);
  CHECK(LoggedReading(path).empty());
  for (const mode_t mode : {0640, 0604, 0644}) {
    REQUIRE(::chmod(path, mode) == 0);
    const std::string logged = LoggedReading(path);
    INFO(logged);
    char octal[8];
    std::snprintf(octal, sizeof(octal), "%o", static_cast<unsigned>(mode));
    CHECK(logged.find(absl::StrCat("etcd.password_file: ", path,
                                   " is readable by group or others (mode ", octal, ")")) !=
          std::string::npos);
    CHECK(logged.find("chmod 600") != std::string::npos);
    CHECK(logged.find(kPassword) == std::string::npos);
  }
  std::remove(path);
}

}  // namespace
}  // namespace kvrail::directory
