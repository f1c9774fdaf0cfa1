#include "daemon/directory/etcd_client.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <atomic>
#include <fstream>
#include <optional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/grpc_status.h"
#include "base/status.h"
#include "proto/etcd/rpc.grpc.pb.h"
#include "spdlog/spdlog.h"

namespace kvrail::directory {

std::string RangeEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

namespace {

// etcd's answers about the auth token (rpctypes): a token it no longer knows (simple tokens
// expire after --auth-token-ttl unused and die with the member's restart), and a call without one
// while authentication is enabled.
constexpr char kInvalidToken[] = "invalid auth token";
constexpr char kNoUser[] = "user name is empty";
constexpr char kAuthNotEnabled[] = "authentication is not enabled";

// A bidi Watch stream. Thread contract: Next() on one thread, Cancel() on any.
class GrpcWatch final : public EtcdWatch {
 public:
  GrpcWatch(std::string where, std::unique_ptr<grpc::ClientContext> context,
            std::unique_ptr<
                grpc::ClientReaderWriter<etcdserverpb::WatchRequest, etcdserverpb::WatchResponse>>
                stream)
      : where_(std::move(where)), context_(std::move(context)), stream_(std::move(stream)) {}

  ~GrpcWatch() override {
    context_->TryCancel();
    stream_->Finish().ok();  // NOLINT: the stream's end status is not needed here
  }

  absl::StatusOr<std::vector<EtcdEvent>> Next() override {
    etcdserverpb::WatchResponse response;
    if (!stream_->Read(&response)) {
      return absl::UnavailableError(absl::StrCat(where_, " Watch: the stream ended"));
    }
    if (response.canceled()) {
      return absl::AbortedError(absl::StrCat(
          where_, " Watch: cancelled by etcd",
          response.compact_revision() != 0
              ? absl::StrCat(" (compacted up to revision ", response.compact_revision(), ")")
              : "",
          response.cancel_reason().empty() ? "" : absl::StrCat(": ", response.cancel_reason())));
    }
    std::vector<EtcdEvent> events;
    events.reserve(response.events_size());
    for (const mvccpb::Event& e : response.events()) {
      EtcdEvent event;
      event.type =
          e.type() == mvccpb::Event::DELETE ? EtcdEvent::Type::kDelete : EtcdEvent::Type::kPut;
      event.kv.key = e.kv().key();
      event.kv.value = e.kv().value();
      event.kv.mod_revision = e.kv().mod_revision();
      event.kv.lease = e.kv().lease();
      events.push_back(std::move(event));
    }
    return events;
  }

  void Cancel() override { context_->TryCancel(); }

 private:
  const std::string where_;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReaderWriter<etcdserverpb::WatchRequest, etcdserverpb::WatchResponse>>
      stream_;
};

// Thread contract: the endpoints are fixed at construction; `current_` is atomic; gRPC stubs
// are thread-safe; the auth token is guarded by auth_mu_ (held across an Authenticate call, so
// concurrent calls that find the token invalid authenticate once).
class GrpcEtcdClient final : public EtcdClient {
 public:
  explicit GrpcEtcdClient(const EtcdClientOptions& options)
      : timeout_(options.call_timeout), username_(options.username), password_(options.password) {
    std::shared_ptr<grpc::ChannelCredentials> credentials;
    const bool tls = !options.ca_pem.empty() || !options.cert_pem.empty();
    if (tls) {
      grpc::SslCredentialsOptions ssl;
      ssl.pem_root_certs = options.ca_pem;
      ssl.pem_cert_chain = options.cert_pem;
      ssl.pem_private_key = options.key_pem;
      credentials = grpc::SslCredentials(ssl);
    } else {
      credentials = grpc::InsecureChannelCredentials();
    }
    for (const std::string& address : options.endpoints) {
      grpc::ChannelArguments args;
      // Reconnect soon after etcd comes back; the directory paces its own retries (Backoff).
      // Measured against etcd 3.4 restarting on loopback: with gRPC's defaults a channel that
      // failed while etcd was down stayed failed for 10+ s after etcd was ready (re-resolution is
      // rate-limited to once per 30 s, and a connection accepted by an etcd still starting never
      // gets its HTTP/2 SETTINGS until the 20 s connect timeout); with these it recovered in
      // ~1.6 s.
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
      args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);  // also the connect timeout
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
      args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 500);
      auto channel = grpc::CreateCustomChannel(address, credentials, args);
      Endpoint endpoint;
      endpoint.address = address;
      endpoint.kv = etcdserverpb::KV::NewStub(channel);
      endpoint.lease = etcdserverpb::Lease::NewStub(channel);
      endpoint.watch = etcdserverpb::Watch::NewStub(channel);
      endpoint.auth = etcdserverpb::Auth::NewStub(channel);
      endpoints_.push_back(std::move(endpoint));
    }
  }

  absl::StatusOr<int64_t> LeaseGrant(int64_t ttl_s) override {
    const size_t e = current_.load();
    etcdserverpb::LeaseGrantRequest request;
    request.set_ttl(ttl_s);
    etcdserverpb::LeaseGrantResponse response;
    KVRAIL_RETURN_IF_ERROR(Unary(e, "LeaseGrant", [&](grpc::ClientContext* context) {
      return endpoints_[e].lease->LeaseGrant(context, request, &response);
    }));
    if (!response.error().empty()) {
      return absl::UnavailableError(absl::StrCat(Where(e), " LeaseGrant: ", response.error()));
    }
    return response.id();
  }

  absl::StatusOr<int64_t> LeaseKeepAlive(int64_t lease) override {
    const size_t e = current_.load();
    etcdserverpb::LeaseKeepAliveRequest request;
    request.set_id(lease);
    etcdserverpb::LeaseKeepAliveResponse response;
    KVRAIL_RETURN_IF_ERROR(Unary(e, "LeaseKeepAlive", [&](grpc::ClientContext* context) {
      auto stream = endpoints_[e].lease->LeaseKeepAlive(context);
      const bool exchanged = stream->Write(request) && stream->Read(&response);
      stream->WritesDone();
      if (exchanged) {
        context->TryCancel();
        stream->Finish().ok();  // NOLINT: the exchange is what counts
        return grpc::Status::OK;
      }
      // The stream ended (etcd refused it, or the connection broke; the deadline bounds this):
      // its status says why, e.g. "etcdserver: invalid auth token".
      grpc::Status status = stream->Finish();
      if (status.ok()) status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream ended");
      return status;
    }));
    if (response.ttl() <= 0) {
      return absl::NotFoundError(absl::StrCat(Where(e), " LeaseKeepAlive: lease ", lease,
                                              " is gone (expired or revoked)"));
    }
    return response.ttl();
  }

  absl::Status LeaseRevoke(int64_t lease) override {
    const size_t e = current_.load();
    etcdserverpb::LeaseRevokeRequest request;
    request.set_id(lease);
    etcdserverpb::LeaseRevokeResponse response;
    return Unary(e, "LeaseRevoke", [&](grpc::ClientContext* context) {
      return endpoints_[e].lease->LeaseRevoke(context, request, &response);
    });
  }

  absl::StatusOr<int64_t> Put(const std::string& key, const std::string& value,
                              int64_t lease) override {
    const size_t e = current_.load();
    etcdserverpb::PutRequest request;
    request.set_key(key);
    request.set_value(value);
    request.set_lease(lease);
    etcdserverpb::PutResponse response;
    KVRAIL_RETURN_IF_ERROR(Unary(e, "Put", [&](grpc::ClientContext* context) {
      return endpoints_[e].kv->Put(context, request, &response);
    }));
    return response.header().revision();
  }

  absl::Status Delete(const std::string& key) override {
    const size_t e = current_.load();
    etcdserverpb::DeleteRangeRequest request;
    request.set_key(key);
    etcdserverpb::DeleteRangeResponse response;
    return Unary(e, "DeleteRange", [&](grpc::ClientContext* context) {
      return endpoints_[e].kv->DeleteRange(context, request, &response);
    });
  }

  absl::StatusOr<EtcdRange> RangePrefix(const std::string& prefix) override {
    const size_t e = current_.load();
    etcdserverpb::RangeRequest request;
    request.set_key(prefix);
    request.set_range_end(RangeEnd(prefix));
    etcdserverpb::RangeResponse response;
    KVRAIL_RETURN_IF_ERROR(Unary(e, "Range", [&](grpc::ClientContext* context) {
      return endpoints_[e].kv->Range(context, request, &response);
    }));
    EtcdRange range;
    range.revision = response.header().revision();
    for (const mvccpb::KeyValue& kv : response.kvs()) {
      range.kvs.push_back(EtcdKv{kv.key(), kv.value(), kv.mod_revision(), kv.lease()});
    }
    return range;
  }

  absl::StatusOr<std::unique_ptr<EtcdWatch>> WatchPrefix(const std::string& prefix,
                                                         int64_t start_revision) override {
    const size_t e = current_.load();
    // etcd checks the token when the watch is created and cancels it ("permission denied") when
    // the token is not valid: authenticate again and create it once more.
    for (int attempt = 0;; ++attempt) {
      std::string token;
      KVRAIL_RETURN_IF_ERROR(Token(e, &token));
      absl::StatusOr<std::unique_ptr<EtcdWatch>> watch =
          CreateWatch(e, prefix, start_revision, token);
      if (watch.ok() || attempt > 0 || !authenticating() ||
          (!absl::StrContains(watch.status().message(), "permission denied") &&
           !TokenRejected(watch.status().message()))) {
        return watch;
      }
      InvalidateToken(token);
    }
  }

  std::string Describe() const override {
    return absl::StrCat("etcd at ", endpoints_[current_.load()].address);
  }

 private:
  struct Endpoint {
    std::string address;
    std::unique_ptr<etcdserverpb::KV::Stub> kv;
    std::unique_ptr<etcdserverpb::Lease::Stub> lease;
    std::unique_ptr<etcdserverpb::Watch::Stub> watch;
    std::unique_ptr<etcdserverpb::Auth::Stub> auth;
  };

  absl::StatusOr<std::unique_ptr<EtcdWatch>> CreateWatch(size_t e, const std::string& prefix,
                                                         int64_t start_revision,
                                                         const std::string& token) {
    auto context = std::make_unique<grpc::ClientContext>();  // no deadline: a long stream
    if (!token.empty()) context->AddMetadata("token", token);
    auto stream = endpoints_[e].watch->Watch(context.get());
    etcdserverpb::WatchRequest request;
    etcdserverpb::WatchCreateRequest* create = request.mutable_create_request();
    create->set_key(prefix);
    create->set_range_end(RangeEnd(prefix));
    create->set_start_revision(start_revision);
    etcdserverpb::WatchResponse created;
    // The first answer says the watch exists; it is awaited under the call timeout (a watchdog
    // cancels the stream if etcd does not answer).
    std::atomic<bool> answered{false};
    grpc::ClientContext* raw = context.get();
    std::thread watchdog([&answered, raw, timeout = timeout_] {
      const absl::Time until = absl::Now() + timeout;
      while (!answered.load() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(10));
      if (!answered.load()) raw->TryCancel();
    });
    const bool ok = stream->Write(request) && stream->Read(&created);
    answered.store(true);
    watchdog.join();
    if (!ok || !created.created() || created.canceled()) {
      context->TryCancel();
      grpc::Status status = stream->Finish();
      if (ok && created.canceled()) {
        // etcd answered, refusing the watch (the stream stays open, so Finish says only
        // CANCELLED): its reason, e.g. "etcdserver: permission denied" for a bad token.
        const bool denied = absl::StrContains(created.cancel_reason(), "permission denied");
        status = grpc::Status(
            denied ? grpc::StatusCode::PERMISSION_DENIED : grpc::StatusCode::UNAVAILABLE,
            created.cancel_reason().empty() ? "watch cancelled at creation"
                                            : created.cancel_reason());
      } else if (status.ok()) {
        status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "watch not created");
      }
      return Failed(e, "Watch", status);
    }
    return std::unique_ptr<EtcdWatch>(
        new GrpcWatch(Where(e), std::move(context), std::move(stream)));
  }

  // A context bounded by the call timeout, carrying `token` (when not empty) as etcd's "token"
  // metadata.
  std::unique_ptr<grpc::ClientContext> Context(const std::string& token) const {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout_));
    if (!token.empty()) context->AddMetadata("token", token);
    return context;
  }

  bool authenticating() const { return !username_.empty(); }

  // Whether etcd's error text says the call's token (or its absence) was refused.
  bool TokenRejected(absl::string_view message) const {
    return authenticating() &&
           (absl::StrContains(message, kInvalidToken) || absl::StrContains(message, kNoUser));
  }

  // Runs the unary exchange `call` (given a fresh context with the token) on endpoint `e`; when
  // etcd says the token is invalid, authenticates again and runs it once more. Errors are named
  // by endpoint and method (Failed).
  template <typename Call>
  absl::Status Unary(size_t e, const char* method, Call call) {
    for (int attempt = 0;; ++attempt) {
      std::string token;
      KVRAIL_RETURN_IF_ERROR(Token(e, &token));
      auto context = Context(token);
      const grpc::Status status = call(context.get());
      if (status.ok()) return absl::OkStatus();
      if (attempt == 0 && TokenRejected(status.error_message())) {
        spdlog::info("etcd {} {}: {}; authenticating again as '{}'", endpoints_[e].address, method,
                     status.error_message(), username_);
        InvalidateToken(token);
        continue;
      }
      return Failed(e, method, status);
    }
  }

  // The token to send: "" without authentication (or while etcd has it disabled); otherwise the
  // current one, authenticating first when there is none.
  absl::Status Token(size_t e, std::string* token) ABSL_LOCKS_EXCLUDED(auth_mu_) {
    token->clear();
    if (!authenticating()) return absl::OkStatus();
    absl::MutexLock lock(&auth_mu_);
    if (!token_.has_value()) {
      KVRAIL_ASSIGN_OR_RETURN(std::string fresh, AuthenticateLocked(e));
      token_ = std::move(fresh);
    }
    *token = *token_;
    return absl::OkStatus();
  }

  // Forgets `stale` (unless another call already replaced it), so the next call authenticates.
  void InvalidateToken(const std::string& stale) ABSL_LOCKS_EXCLUDED(auth_mu_) {
    absl::MutexLock lock(&auth_mu_);
    if (token_.has_value() && *token_ == stale) token_.reset();
  }

  // Auth.Authenticate as username_. "" when etcd has authentication disabled (calls then go
  // without a token; should etcd enable it later, its "user name is empty" brings us back here).
  absl::StatusOr<std::string> AuthenticateLocked(size_t e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(auth_mu_) {
    etcdserverpb::AuthenticateRequest request;
    request.set_name(username_);
    request.set_password(password_);
    etcdserverpb::AuthenticateResponse response;
    auto context = Context("");
    const grpc::Status status = endpoints_[e].auth->Authenticate(context.get(), request, &response);
    if (status.ok()) {
      if (response.token().empty()) {
        return absl::UnauthenticatedError(
            absl::StrCat(Where(e), " Authenticate as etcd.username '", username_,
                         "': etcd answered no token (etcd.username, etcd.password_file)"));
      }
      return response.token();
    }
    if (absl::StrContains(status.error_message(), kAuthNotEnabled)) return std::string();
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
        status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      return Failed(e, "Authenticate", status);
    }
    // etcd's own text ("authentication failed, invalid user ID or password"); never the password.
    return absl::UnauthenticatedError(absl::StrCat(
        Where(e), " Authenticate as etcd.username '", username_, "': ", status.error_message(),
        " (check etcd.username and the password in etcd.password_file)"));
  }

  std::string Where(size_t e) const { return absl::StrCat("etcd ", endpoints_[e].address); }

  // The error, named by endpoint and method; an unreachable endpoint makes the next one current.
  absl::Status Failed(size_t e, const char* method, const grpc::Status& status) {
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
        status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      size_t expected = e;
      current_.compare_exchange_strong(expected, (e + 1) % endpoints_.size());
    }
    const absl::Status s = FromGrpcStatus(status);
    const char* hint = "";
    if (absl::StrContains(s.message(), kNoUser) && !authenticating()) {
      hint = " (etcd has authentication enabled: set etcd.username and etcd.password_file)";
    } else if (absl::StrContains(s.message(), "permission denied") && authenticating()) {
      hint = " (etcd.username lacks a role with read/write permission on etcd.prefix)";
    }
    return absl::Status(s.code(), absl::StrCat(Where(e), " ", method, ": ", s.message(), hint));
  }

  const absl::Duration timeout_;
  const std::string username_;
  const std::string password_;  // never logged nor put in an error
  std::vector<Endpoint> endpoints_;
  std::atomic<size_t> current_{0};
  absl::Mutex auth_mu_;
  // nullopt: authenticate before the next call; "": etcd has authentication disabled.
  std::optional<std::string> token_ ABSL_GUARDED_BY(auth_mu_);
};

}  // namespace

absl::StatusOr<std::string> ReadEtcdPasswordFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat("etcd.password_file: cannot read ", path));
  }
  std::string line;
  std::getline(in, line);
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (line.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd.password_file: ", path, " has no password on its first line"));
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    spdlog::warn(
        "etcd.password_file: {} is readable by group or others (mode {:o}); make it "
        "readable by kvraild's user only (chmod 600)",
        path, st.st_mode & 0777);
  }
  return line;
}

absl::StatusOr<std::unique_ptr<EtcdClient>> CreateGrpcEtcdClient(const EtcdClientOptions& options) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError("etcd.endpoints: none given");
  }
  if (options.username.empty() != options.password.empty()) {
    return absl::InvalidArgumentError(
        "etcd.username: authentication needs both a user name and a password");
  }
  return std::unique_ptr<EtcdClient>(new GrpcEtcdClient(options));
}

}  // namespace kvrail::directory
