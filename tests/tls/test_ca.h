// A throwaway certificate authority for tests of mTLS between daemons: Debian's openssl makes a
// CA key and certificate in a temporary folder and issues node certificates (subject CN = the
// node id, serverAuth + clientAuth, no SANs) signed by it. Not thread-safe.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "tests/harness/daemon_process.h"

namespace kvrail::testing {

class TestCa {
 public:
  // Paths of one issued certificate and its key (PEM), in the CA's folder.
  struct Issued {
    std::string cert_file;
    std::string key_file;
  };

  // Makes the CA ("kvrail test CA <name>"); status() says whether openssl managed.
  explicit TestCa(const std::string& name = "main");
  const absl::Status& status() const { return status_; }
  const std::string& ca_file() const { return ca_file_; }
  const std::string& dir() const { return dir_.path(); }

  // A certificate whose subject CN is `cn`, signed by this CA (issued once per CN; later calls
  // return the same files).
  absl::StatusOr<Issued> Issue(const std::string& cn);
  // A certificate with subject `subject` (openssl's "/CN=a/CN=b" form), signed by this CA, in
  // files named after `name` (issued once per name; Issue(name) then returns the same files).
  absl::StatusOr<Issued> IssueSubject(const std::string& name, const std::string& subject);
  // The same files as DaemonConfig text: `peer_tls { ca_file: ... cert_file: ... key_file: ... }`.
  absl::StatusOr<std::string> ConfigFor(const std::string& cn);

 private:
  TempDir dir_;
  std::string name_;
  std::string config_;
  std::string ca_file_, ca_key_;
  absl::Status status_;
  int serial_ = 1;
};

}  // namespace kvrail::testing
