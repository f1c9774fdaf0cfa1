// kvraild as an operator rolls it out, on a machine without a GPU: `cuda_engine: required`
// refuses to start (at error priority) instead of serving without its GPUs, `auto` says why at
// warning and the kvrail_cuda_gpus gauge shows 0; `--check-config` validates a file naming the
// field; a client-supplied region name cannot forge a log line.
#include <signal.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "tests/integration/kv_fixture.h"

namespace kvrail::testing {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

// kvraild with `args`, stderr to `log` with JOURNAL_STREAM naming that file (as systemd sets it
// for StandardError=journal), so lines carry their syslog priority; `timeout` ends a daemon that
// did not exit by itself (exit 124).
CommandResult RunDaemonUnderJournal(const std::vector<std::string>& args, const std::string& log,
                                    int timeout_s) {
  std::string command =
      "exec 2>\"$1\"; shift; JOURNAL_STREAM=$(stat -c %d:%i \"$LOG\") exec "
      "timeout -s TERM " +
      std::to_string(timeout_s) + " \"$@\"";
  std::vector<std::string> argv = {"/bin/bash", "-c", "LOG=\"$1\"; " + command,
                                   "bash",      log,  RunfilePath("daemon/kvraild")};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv);
}

int MetricsPort(const std::string& log) {
  std::smatch m;
  if (!std::regex_search(log, m, std::regex(R"(metrics on 127\.0\.0\.1:0 \(port (\d+)\))")))
    return 0;
  return std::stoi(m[1]);
}

// JOURNAL_STREAM names stderr but journald's socket is missing (as on a build machine): the lines
// still reach stderr with their priorities.
TEST_CASE("cuda_engine required without CUDA: start refused at error priority, nothing serves",
          "[journal]") {
  TempDir dir;
  const std::string socket = dir.path() + "/kvrail.sock";
  const std::string log = dir.path() + "/log";
  const CommandResult r = RunDaemonUnderJournal(
      {"--socket", socket, "--cuda-engine", "required", "--log-level", "info"}, log, 60);
  const std::string text = ReadFile(log);
  INFO(text);
  // Refused (3), not served until the timeout (124) nor crashed.
  CHECK(r.exit_code == 3);
  // The reason at error priority (<3>), naming the setting; no "ready" line was ever written.
  CHECK(std::regex_search(text, std::regex(R"((^|\n)<3>.*cuda_engine: required.*)")));
  CHECK(text.find("ready:") == std::string::npos);
  // Every line is one journald entry with a priority (the fatal line included).
  for (const absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    INFO(line);
    CHECK(std::regex_match(std::string(line), std::regex(R"(<[2-7]>.*)")));
  }
  // Nothing answers on the socket: the health check fails (what a readiness probe sees).
  const CommandResult health =
      RunCommand({RunfilePath("tools/kvrail/kvrail"), "--socket", socket, "health"});
  CHECK(health.exit_code != 0);
}

TEST_CASE("cuda_engine auto without CUDA: serves, says why at warning, kvrail_cuda_gpus is 0") {
  TempDir dir;
  DaemonProcess daemon;
  REQUIRE(daemon.Start(dir.path(), {"--cuda-engine", "auto", "--metrics-listen", "127.0.0.1:0"}));
  const std::string log = daemon.ReadLog();
  INFO(log);
  CHECK(std::regex_search(log,
                          std::regex(R"(\bwarning \[\d+\] no CUDA engine \(cuda_engine: auto\))")));
  const int port = MetricsPort(log);
  REQUIRE(port > 0);
  const std::string body = HttpGet(port, "/metrics");
  INFO(body);
  CHECK(body.find("\nkvrail_cuda_gpus{mode=\"auto\"} 0\n") != std::string::npos);
  CHECK(body.find("# TYPE kvrail_cuda_gpus gauge") != std::string::npos);
  CHECK(body.find("\nkvrail_gpus 0\n") != std::string::npos);
  CHECK(daemon.Stop(SIGTERM) == 0);
}

TEST_CASE("--check-config: 0 for a valid file, 1 naming the field otherwise, nothing started") {
  TempDir dir;
  const std::string kvraild = RunfilePath("daemon/kvraild");
  const std::string good = dir.path() + "/good.textproto";
  WriteFile(good,
            "unix_socket: \"/nonexistent/dir/kvrail.sock\"\ncuda_engine: \"required\"\n"
            "cuda_mps_pipe_directory: \"/run/nvidia/mps/nvidia.com/gpu/pipe\"\n");
  CommandResult r = RunCommand({kvraild, "--check-config", good});
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("ok") != std::string::npos);

  const std::pair<std::string, std::string> bad[] = {
      {"cuda_engine: \"sometimes\"\n", "cuda_engine"},
      {"cuda_mps_pipe_directory: \"relative/pipe\"\n", "cuda_mps_pipe_directory"},
      {"log_format: \"xml\"\n", "log_format"},
      {"log_level: \"loud\"\n", "log_level"},
      {"tile_bytes: 12\n", "tile_bytes"},
      {"no_such_field: 1\n", "no_such_field"},
  };
  for (const auto& [text, field] : bad) {
    const std::string path = dir.path() + "/bad.textproto";
    WriteFile(path, text);
    r = RunCommand({kvraild, "--check-config", path});
    INFO(text << " -> " << r.out << r.err);
    CHECK(r.exit_code == 1);
    CHECK(r.err.find(field) != std::string::npos);
  }
  r = RunCommand({kvraild, "--check-config", dir.path() + "/missing.textproto"});
  CHECK(r.exit_code == 1);
}

TEST_CASE("a region name with newlines and escape sequences stays inside one log line") {
  TempDir dir;
  DaemonProcess daemon;
  REQUIRE(daemon.Start(dir.path(), {"--log-format", "text"}));
  auto c = client::Client::Connect(daemon.socket());
  REQUIRE(c.ok());
  const std::string name = "tenant\n<3>kvraild: FORGED error\r\x1b[2J\tend";
  const auto layout =
      MakeLayout(1, 1, 2, 16, 1, 64, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  Pool pool = MakePool(**c, layout, true, name);
  c->reset();
  REQUIRE(daemon.Stop(SIGTERM) == 0);
  const std::string log = daemon.ReadLog();
  INFO(log);
  std::vector<std::string> with_name;
  for (const absl::string_view line : absl::StrSplit(log, '\n')) {
    if (line.find("FORGED") != absl::string_view::npos) with_name.emplace_back(line);
    // No line the name could have started: a line begins with the time stamp, never "<3>".
    CHECK(line.rfind("<", 0) != 0);
    CHECK(line.find('\x1b') == absl::string_view::npos);
    CHECK(line.find('\r') == absl::string_view::npos);
  }
  REQUIRE(with_name.size() == 1);
  // A field, escaped as the message would be.
  CHECK(with_name[0].find(R"( region_name="tenant\n<3>kvraild: FORGED error\r\x1b[2J\tend" )") !=
        std::string::npos);
  CHECK(with_name[0].find(" info ") != std::string::npos);
}

}  // namespace
}  // namespace kvrail::testing
