// A small client of etcd v3's gRPC API (proto/etcd): the calls the etcd directory makes, behind
// an interface so the directory's logic is tested against a fake (etcd_directory_test.cc) and
// against a real etcd (tests in this package start the `etcd` binary).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvrail::directory {

struct EtcdKv {
  std::string key;
  std::string value;
  int64_t mod_revision = 0;
  int64_t lease = 0;
};

struct EtcdRange {
  std::vector<EtcdKv> kvs;
  int64_t revision = 0;  // the store's revision the range was read at
};

struct EtcdEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  EtcdKv kv;  // for a delete: the key (and the revision of the deletion)
};

// One watch stream. Thread contract: Next() on one thread; Cancel() from any thread.
class EtcdWatch {
 public:
  virtual ~EtcdWatch() = default;
  // Blocks for the next batch of events (possibly empty: a progress notification). An error
  // when the stream ended: etcd unreachable, the watch cancelled (by Cancel() or by etcd, e.g.
  // its start revision was compacted), ...
  virtual absl::StatusOr<std::vector<EtcdEvent>> Next() = 0;
  // Makes a blocked Next() return an error.
  virtual void Cancel() = 0;
};

// Thread-safe. Every call is bounded by the client's call timeout; UNAVAILABLE or
// DEADLINE_EXCEEDED when etcd cannot be reached.
class EtcdClient {
 public:
  virtual ~EtcdClient() = default;
  // Grants a lease of `ttl_s` seconds; returns its id.
  virtual absl::StatusOr<int64_t> LeaseGrant(int64_t ttl_s) = 0;
  // One keep-alive of `lease` (a LeaseKeepAlive stream exchange); returns the renewed TTL.
  // NOT_FOUND when the lease is gone (expired or revoked).
  virtual absl::StatusOr<int64_t> LeaseKeepAlive(int64_t lease) = 0;
  virtual absl::Status LeaseRevoke(int64_t lease) = 0;
  // Puts key = value attached to `lease` (0: none); returns the new revision.
  virtual absl::StatusOr<int64_t> Put(const std::string& key, const std::string& value,
                                      int64_t lease) = 0;
  virtual absl::Status Delete(const std::string& key) = 0;
  // Every key with the prefix.
  virtual absl::StatusOr<EtcdRange> RangePrefix(const std::string& prefix) = 0;
  // Watches the prefix from `start_revision` (events at that revision included).
  virtual absl::StatusOr<std::unique_ptr<EtcdWatch>> WatchPrefix(const std::string& prefix,
                                                                 int64_t start_revision) = 0;
  // For logs: which endpoint the client talks to now.
  virtual std::string Describe() const = 0;
};

struct EtcdClientOptions {
  // "host:port" each; the client uses one at a time and moves to the next when a call finds it
  // unreachable.
  std::vector<std::string> endpoints;
  // PEM contents (not paths). All empty: plaintext. ca alone: TLS verifying etcd; cert + key:
  // client certificate too.
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
  // etcd user/password authentication (EtcdDirectoryConfig.username / password_file): when
  // `username` is set, the client calls Auth.Authenticate before its first call and sends the
  // token as the "token" metadata of every KV, Lease and Watch call; when etcd answers that the
  // token is invalid (expired, or etcd restarted), it authenticates again and retries the call
  // once. A refused authentication is UNAUTHENTICATED naming etcd.username and
  // etcd.password_file. The password is kept in memory only and never put in an error or log.
  std::string username;
  std::string password;
  absl::Duration call_timeout = absl::Seconds(3);
};

// The password for EtcdClientOptions.password from EtcdDirectoryConfig.password_file: its first
// line (without the line end). INVALID_ARGUMENT naming etcd.password_file when it cannot be read
// or the line is empty; a warning (never the contents) when the file is readable by group or
// others.
absl::StatusOr<std::string> ReadEtcdPasswordFile(const std::string& path);

// The gRPC client. Fails only on bad options (no endpoints).
absl::StatusOr<std::unique_ptr<EtcdClient>> CreateGrpcEtcdClient(const EtcdClientOptions& options);

// The end of the range [prefix, RangeEnd(prefix)): the prefix with its last byte incremented
// (etcd's convention for "every key with this prefix").
std::string RangeEnd(const std::string& prefix);

}  // namespace kvrail::directory
