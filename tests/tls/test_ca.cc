#include "tests/tls/test_ca.h"

#include <unistd.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvrail::testing {
namespace {

// Runs openssl with `args`; an error naming the command and its stderr when it fails.
absl::Status OpenSsl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"/usr/bin/openssl"};
  argv.insert(argv.end(), args.begin(), args.end());
  const CommandResult result = RunCommand(argv);
  if (result.exit_code == 0) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(absl::StrJoin(argv, " "), " exited ", result.exit_code, ": ", result.err));
}

}  // namespace

TestCa::TestCa(const std::string& name) : name_(name) {
  config_ = dir_.path() + "/openssl.cnf";
  ca_file_ = dir_.path() + "/ca.pem";
  ca_key_ = dir_.path() + "/ca.key";
  {
    std::ofstream f(config_);
    f << "[req]\ndistinguished_name = dn\nprompt = no\n"
      << "[dn]\nCN = kvrail test CA " << name << "\n"
      << "[ca]\nbasicConstraints = critical,CA:TRUE\n"
      << "keyUsage = critical,keyCertSign,cRLSign\nsubjectKeyIdentifier = hash\n"
      << "[node]\nbasicConstraints = critical,CA:FALSE\n"
      << "keyUsage = critical,digitalSignature,keyEncipherment\n"
      << "extendedKeyUsage = serverAuth,clientAuth\nauthorityKeyIdentifier = keyid\n";
  }
  status_ = OpenSsl({"req", "-x509", "-config", config_, "-extensions", "ca", "-newkey", "ec",
                     "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", ca_key_,
                     "-out", ca_file_, "-days", "2"});
}

absl::StatusOr<TestCa::Issued> TestCa::Issue(const std::string& cn) {
  return IssueSubject(cn, "/CN=" + cn);
}

absl::StatusOr<TestCa::Issued> TestCa::IssueSubject(const std::string& name,
                                                    const std::string& subject) {
  if (!status_.ok()) return status_;
  Issued issued;
  issued.cert_file = absl::StrCat(dir_.path(), "/", name, ".pem");
  issued.key_file = absl::StrCat(dir_.path(), "/", name, ".key");
  if (::access(issued.cert_file.c_str(), R_OK) == 0) return issued;
  const std::string csr = absl::StrCat(dir_.path(), "/", name, ".csr");
  absl::Status made = OpenSsl({"req", "-new", "-config", config_, "-newkey", "ec", "-pkeyopt",
                               "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", issued.key_file,
                               "-out", csr, "-subj", subject});
  if (!made.ok()) return made;
  made = OpenSsl({"x509", "-req", "-in", csr, "-CA", ca_file_, "-CAkey", ca_key_, "-set_serial",
                  std::to_string(++serial_), "-out", issued.cert_file, "-days", "2", "-extfile",
                  config_, "-extensions", "node"});
  if (!made.ok()) return made;
  return issued;
}

absl::StatusOr<std::string> TestCa::ConfigFor(const std::string& cn) {
  absl::StatusOr<Issued> issued = Issue(cn);
  if (!issued.ok()) return issued.status();
  return absl::StrCat("peer_tls { ca_file: \"", ca_file_, "\" cert_file: \"", issued->cert_file,
                      "\" key_file: \"", issued->key_file, "\" }\n");
}

}  // namespace kvrail::testing
