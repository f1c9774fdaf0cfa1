// A kvraild for a GPU benchmark program: started in a temporary folder with DaemonConfig lines
// (written to a file for --config) and extra flags, at --log-level info (no per-transfer debug
// lines in the figures), with a connected client; stopped (SIGTERM) when it goes. A start that
// fails ends the program with the daemon's log on stderr.
#pragma once

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/kvrail_client.h"
#include "tests/gpu/bench_check.h"
#include "tests/harness/daemon_process.h"

namespace kvrail::gpu_bench {

struct BenchDaemon {
  testing::TempDir dir;
  testing::DaemonProcess process;
  std::unique_ptr<client::Client> client;
  BenchDaemon(const std::string& config, const std::vector<std::string>& args) {
    std::vector<std::string> all;
    if (!config.empty()) {
      const std::string path = dir.path() + "/kvraild.textproto";
      std::ofstream(path) << config << "\n";
      all = {"--config", path};
    }
    all.insert(all.end(), args.begin(), args.end());
    process.set_log_level("info");
    if (!process.Start(dir.path(), all)) {
      std::fprintf(stderr, "kvraild did not start:\n%s\n", process.ReadLog().c_str());
      std::exit(1);
    }
    client = Must(client::Client::Connect(process.socket()), "connect");
  }
  ~BenchDaemon() { process.Stop(SIGTERM); }
  // GetStats' engine lines, " | " between them.
  std::string Engines() {
    v1::Stats stats = Must(client->GetStats(), "stats");
    std::string out;
    for (const auto& e : stats.engines()) absl::StrAppend(&out, out.empty() ? "" : " | ", e);
    return out;
  }
};

}  // namespace kvrail::gpu_bench
