#include "daemon/metrics/mps.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/harness/daemon_process.h"

namespace kvrail::metrics {
namespace {

namespace fs = std::filesystem;

void Write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

// A fake /proc entry for a process `comm` running as real uid `uid`.
void AddProcess(const fs::path& proc, int pid, const std::string& comm, int uid) {
  Write(proc / std::to_string(pid) / "comm", comm + "\n");
  Write(proc / std::to_string(pid) / "status",
        "Name:\t" + comm + "\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t" + std::to_string(uid) +
            "\t" + std::to_string(uid) + "\t" + std::to_string(uid) + "\t" + std::to_string(uid) +
            "\n");
}

struct Fixture {
  testing::TempDir dir;
  fs::path pipe() const { return fs::path(dir.path()) / "mps"; }
  fs::path proc() const { return fs::path(dir.path()) / "proc"; }
  MpsProbeOptions Options(uid_t uid) const {
    MpsProbeOptions o;
    o.pipe_directory = pipe().string();
    o.proc_root = proc().string();
    o.daemon_uid = uid;
    return o;
  }
  Fixture() {
    fs::create_directories(proc());
    AddProcess(proc(), 1, "systemd", 0);
  }
};

TEST_CASE("mps: no control pipe means MPS is not active and nothing to warn about") {
  Fixture f;
  AddProcess(f.proc(), 50, "nvidia-cuda-mps-server", 1000);  // a server without our pipe: ignored
  const v1::OpsMps mps = ProbeMps(f.Options(990));
  CHECK_FALSE(mps.active());
  CHECK(mps.verdict() == "MPS not active");
  CHECK_FALSE(MpsNeedsAttention(mps));
}

TEST_CASE("mps: a server of another user means kvraild does not co-run (warn)") {
  Fixture f;
  Write(f.pipe() / "control", "");
  AddProcess(f.proc(), 40, "nvidia-cuda-mps-control", 0);
  AddProcess(f.proc(), 41, "nvidia-cuda-mps-server", 1000);
  const v1::OpsMps mps = ProbeMps(f.Options(990));
  CHECK(mps.active());
  CHECK(mps.server_uid() == 1000);
  CHECK(mps.daemon_uid() == 990);
  INFO(mps.verdict());
  CHECK(mps.verdict().rfind(
            "not co-running: the MPS server runs as uid 1000 and kvraild as uid 990", 0) == 0);
  CHECK(MpsNeedsAttention(mps));
}

TEST_CASE("mps: a server of kvraild's own user co-runs") {
  Fixture f;
  Write(f.pipe() / "control", "");
  AddProcess(f.proc(), 41, "nvidia-cuda-mps-server", 990);
  const v1::OpsMps mps = ProbeMps(f.Options(990));
  CHECK(mps.server_uid() == 990);
  CHECK(mps.verdict().rfind("co-running", 0) == 0);
  CHECK_FALSE(MpsNeedsAttention(mps));
}

TEST_CASE("mps: no server running yet cannot be told (warn naming the uid to use)") {
  Fixture f;
  Write(f.pipe() / "control", "");
  const v1::OpsMps mps = ProbeMps(f.Options(990));
  CHECK(mps.active());
  CHECK(mps.server_uid() == -1);
  INFO(mps.verdict());
  CHECK(mps.verdict().rfind("unknown:", 0) == 0);
  CHECK(mps.verdict().find("uid 990") != std::string::npos);
  CHECK(MpsNeedsAttention(mps));
}

}  // namespace
}  // namespace kvrail::metrics
