#include "daemon/directory/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/grpc_status.h"
#include "proto/etcd/rpc.grpc.pb.h"

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

// A unary call's failure returns from the calling function, named by endpoint and method.
#define KVRAIL_ETCD_CALL(e, method, call)            \
  do {                                               \
    const grpc::Status etcd_status_ = (call);        \
    if (!etcd_status_.ok()) return Failed((e), (method), etcd_status_); \
  } while (false)

// A bidi Watch stream. Thread contract: Next() on one thread, Cancel() on any.
class GrpcWatch final : public EtcdWatch {
 public:
  GrpcWatch(std::string where, std::unique_ptr<grpc::ClientContext> context,
            std::unique_ptr<grpc::ClientReaderWriter<etcdserverpb::WatchRequest,
                                                     etcdserverpb::WatchResponse>> stream)
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
      event.type = e.type() == mvccpb::Event::DELETE ? EtcdEvent::Type::kDelete
                                                     : EtcdEvent::Type::kPut;
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
// are thread-safe.
class GrpcEtcdClient final : public EtcdClient {
 public:
  explicit GrpcEtcdClient(const EtcdClientOptions& options) : timeout_(options.call_timeout) {
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
      endpoints_.push_back(std::move(endpoint));
    }
  }

  absl::StatusOr<int64_t> LeaseGrant(int64_t ttl_s) override {
    const size_t e = current_.load();
    etcdserverpb::LeaseGrantRequest request;
    request.set_ttl(ttl_s);
    etcdserverpb::LeaseGrantResponse response;
    auto context = Context();
    KVRAIL_ETCD_CALL(e, "LeaseGrant",
                     endpoints_[e].lease->LeaseGrant(context.get(), request, &response));
    if (!response.error().empty()) {
      return absl::UnavailableError(
          absl::StrCat(Where(e), " LeaseGrant: ", response.error()));
    }
    return response.id();
  }

  absl::StatusOr<int64_t> LeaseKeepAlive(int64_t lease) override {
    const size_t e = current_.load();
    auto context = Context();
    auto stream = endpoints_[e].lease->LeaseKeepAlive(context.get());
    etcdserverpb::LeaseKeepAliveRequest request;
    request.set_id(lease);
    etcdserverpb::LeaseKeepAliveResponse response;
    const bool exchanged = stream->Write(request) && stream->Read(&response);
    stream->WritesDone();
    if (!exchanged) {
      context->TryCancel();
      grpc::Status status = stream->Finish();
      if (status.ok()) status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream ended");
      return Failed(e, "LeaseKeepAlive", status);
    }
    context->TryCancel();
    stream->Finish().ok();  // NOLINT: the exchange is what counts
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
    auto context = Context();
    grpc::Status status = endpoints_[e].lease->LeaseRevoke(context.get(), request, &response);
    if (!status.ok()) return Failed(e, "LeaseRevoke", status);
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> Put(const std::string& key, const std::string& value,
                              int64_t lease) override {
    const size_t e = current_.load();
    etcdserverpb::PutRequest request;
    request.set_key(key);
    request.set_value(value);
    request.set_lease(lease);
    etcdserverpb::PutResponse response;
    auto context = Context();
    KVRAIL_ETCD_CALL(e, "Put", endpoints_[e].kv->Put(context.get(), request, &response));
    return response.header().revision();
  }

  absl::Status Delete(const std::string& key) override {
    const size_t e = current_.load();
    etcdserverpb::DeleteRangeRequest request;
    request.set_key(key);
    etcdserverpb::DeleteRangeResponse response;
    auto context = Context();
    grpc::Status status = endpoints_[e].kv->DeleteRange(context.get(), request, &response);
    if (!status.ok()) return Failed(e, "DeleteRange", status);
    return absl::OkStatus();
  }

  absl::StatusOr<EtcdRange> RangePrefix(const std::string& prefix) override {
    const size_t e = current_.load();
    etcdserverpb::RangeRequest request;
    request.set_key(prefix);
    request.set_range_end(RangeEnd(prefix));
    etcdserverpb::RangeResponse response;
    auto context = Context();
    KVRAIL_ETCD_CALL(e, "Range", endpoints_[e].kv->Range(context.get(), request, &response));
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
    auto context = std::make_unique<grpc::ClientContext>();  // no deadline: a long stream
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
      if (status.ok()) {
        status = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                              created.cancel_reason().empty() ? "watch not created"
                                                              : created.cancel_reason());
      }
      return Failed(e, "Watch", status);
    }
    return std::unique_ptr<EtcdWatch>(
        new GrpcWatch(Where(e), std::move(context), std::move(stream)));
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
  };

  std::unique_ptr<grpc::ClientContext> Context() const {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() +
                          absl::ToChronoMilliseconds(timeout_));
    return context;
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
    return absl::Status(s.code(), absl::StrCat(Where(e), " ", method, ": ", s.message()));
  }

  const absl::Duration timeout_;
  std::vector<Endpoint> endpoints_;
  std::atomic<size_t> current_{0};
};

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdClient>> CreateGrpcEtcdClient(const EtcdClientOptions& options) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError("etcd.endpoints: none given");
  }
  return std::unique_ptr<EtcdClient>(new GrpcEtcdClient(options));
}

}  // namespace kvrail::directory
