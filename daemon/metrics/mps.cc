#include "daemon/metrics/mps.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvrail::metrics {
namespace {

std::string ReadFirstLine(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// Real uids of the running nvidia-cuda-mps-server processes visible under `proc_root`.
std::set<int64_t> MpsServerUids(const std::string& proc_root) {
  std::set<int64_t> uids;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(proc_root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    if (ReadFirstLine(entry.path() / "comm") != "nvidia-cuda-mps-server") continue;
    std::ifstream status(entry.path() / "status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("Uid:", 0) != 0) continue;
      std::istringstream fields(line.substr(4));
      int64_t real_uid = -1;
      if (fields >> real_uid) uids.insert(real_uid);
      break;
    }
  }
  return uids;
}

}  // namespace

v1::OpsMps ProbeMps(const MpsProbeOptions& options) {
  v1::OpsMps mps;
  const std::string dir =
      options.pipe_directory.empty() ? "/tmp/nvidia-mps" : options.pipe_directory;
  mps.set_pipe_directory(dir);
  mps.set_daemon_uid(options.daemon_uid);
  mps.set_server_uid(-1);
  std::error_code ec;
  mps.set_active(std::filesystem::exists(std::filesystem::path(dir) / "control", ec));
  if (!mps.active()) {
    mps.set_verdict("MPS not active");
    return mps;
  }
  const std::set<int64_t> uids = MpsServerUids(options.proc_root);
  const std::string me = absl::StrCat(options.daemon_uid);
  if (uids.empty()) {
    mps.set_verdict(absl::StrCat(
        "unknown: no MPS server runs yet (the control daemon starts one for the first client, "
        "as that client's user); kvraild (uid ",
        me, ") co-runs with inference servers only if they run as uid ", me, " too"));
  } else if (uids.size() == 1 && *uids.begin() == options.daemon_uid) {
    mps.set_server_uid(*uids.begin());
    mps.set_verdict(absl::StrCat("co-running: the MPS server runs as uid ", me, ", as kvraild"));
  } else {
    mps.set_server_uid(*uids.begin());
    mps.set_verdict(absl::StrCat(
        "not co-running: the MPS server runs as uid ", absl::StrJoin(uids, ","),
        " and kvraild as uid ", me,
        "; an MPS server serves one user, so kvraild's kernels wait for it to exit; run "
        "kvraild and the inference servers as one user (docs/operations.md, MPS)"));
  }
  return mps;
}

bool MpsNeedsAttention(const v1::OpsMps& mps) {
  return mps.active() && mps.verdict().rfind("co-running", 0) != 0;
}

}  // namespace kvrail::metrics
