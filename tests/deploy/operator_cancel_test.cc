// `kvrail transfers cancel` of another session's transfer, as the operator (audited),
// as another uid and as a tenant session of the operator's uid. Its own target, tagged local:
// running the CLI as another uid (setuid, root only) is not allowed inside Bazel's sandbox.
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/integration/kv_fixture.h"

namespace kvrail::testing {
namespace {

CommandResult Cli(const DaemonProcess& daemon, std::vector<std::string> args) {
  args.insert(args.begin(), {RunfilePath("tools/kvrail/kvrail"), "--socket", daemon.socket()});
  return RunCommand(args);
}

// Runs `argv` as `uid`:`gid` with `groups` as its supplementary groups (root only); returns the
// exit status and output, or exit_code 126 with the reason in `err` when the ids cannot be set.
CommandResult RunAs(uid_t uid, gid_t gid, const std::vector<gid_t>& groups,
                    std::vector<std::string> args) {
  TempDir dir;
  const std::string out_path = dir.path() + "/out", err_path = dir.path() + "/err";
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT, 0644);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT, 0644);
    ::dup2(out, 1);
    ::dup2(err, 2);
    if (::setgroups(groups.size(), groups.data()) != 0 || ::setgid(gid) != 0 ||
        ::setuid(uid) != 0) {
      ::dprintf(2, "cannot become uid %u gid %u: %s\n", uid, gid, std::strerror(errno));
      ::_exit(126);
    }
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  CommandResult result;
  int status = 0;
  ::waitpid(pid, &status, 0);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  auto slurp = [](const std::string& p) {
    std::ifstream in(p);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  result.out = slurp(out_path);
  result.err = slurp(err_path);
  return result;
}

// The operator (root, from a session that owns no regions) may
// cancel another session's transfer - a stuck or runaway one - with an audit line naming its
// uid; anyone else, a session of the same uid that owns regions included, is refused naming
// transfer_id, and the transfer stays as it was. The CLI is the operator here (it runs as the
// daemon's uid, as this test does); the non-operator is the same CLI run as nobody (uid 65534)
// in the socket's group, which needs root.
TEST_CASE("kvrail transfers cancel: the operator cancels another session's transfer, audited") {
  TempDir dir;
  REQUIRE(::chmod(dir.path().c_str(), 0711) == 0);  // nobody reaches the socket inside
  DaemonProcess daemon;
  REQUIRE(daemon.Start(dir.path(), {"--log-format", "json"}));
  auto c = client::Client::Connect(daemon.socket());
  REQUIRE(c.ok());
  const auto layout =
      MakeLayout(4, 2, 16, 16, 2, 64, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  Pool src = MakePool(**c, layout, false);
  Pool dst = MakePool(**c, layout, true);
  // Layer-wise with no layer marked ready: it waits until someone cancels it.
  auto spec = client::MakeBlockTransfer(src.id(), {0, 1}, dst.id(), {2, 3});
  spec.set_layerwise(true);
  auto t = (*c)->Submit(spec);
  REQUIRE(t.ok());
  const std::string id = std::to_string(t->transfer_id());
  // Queued: no layer is ready.
  REQUIRE((*c)->Get(t->transfer_id())->state() == v1::TRANSFER_STATE_QUEUED);

  if (::geteuid() == 0) {
    // The CLI binary where nobody may run it (the runfiles are under root's home).
    TempDir bin;
    REQUIRE(::chmod(bin.path().c_str(), 0755) == 0);
    const std::string cli = bin.path() + "/kvrail";
    std::filesystem::copy_file(RunfilePath("tools/kvrail/kvrail"), cli);
    REQUIRE(::chmod(cli.c_str(), 0755) == 0);
    struct stat socket_stat {};
    REQUIRE(::stat(daemon.socket().c_str(), &socket_stat) == 0);
    CommandResult refused = RunAs(65534, 65534, {socket_stat.st_gid},
                                  {cli, "--socket", daemon.socket(), "transfers", "cancel", id});
    INFO(refused.out << refused.err);
    REQUIRE(refused.exit_code != 126);  // root could not become nobody: nothing was tried
    CHECK(refused.exit_code == 1);
    // nobody may not even read the transfer: it is told what an unknown id is told.
    CHECK(refused.err.find("NOT_FOUND") != std::string::npos);
    CHECK(refused.err.find("transfer_id: no transfer " + id) != std::string::npos);
    CHECK((*c)->Get(t->transfer_id())->state() == v1::TRANSFER_STATE_QUEUED);
  } else {
    WARN("skipped the non-operator half (running the CLI as another uid needs root)");
  }
  // A session of the operator's uid that owns regions is a tenant: refused too (under MPS every
  // inference server may run as kvraild's uid).
  auto tenant = client::Client::Connect(daemon.socket());
  REQUIRE(tenant.ok());
  Pool tenant_pool = MakePool(**tenant, layout, true);
  auto tenant_cancel = (*tenant)->Cancel(t->transfer_id());
  INFO(tenant_cancel.status().ToString());
  CHECK(tenant_cancel.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(tenant_cancel.status().message().find("transfer_id: transfer " + id) != std::string::npos);
  CHECK(tenant_cancel.status().message().find("only root may cancel another session's transfer") !=
        std::string::npos);
  CHECK((*c)->Get(t->transfer_id())->state() == v1::TRANSFER_STATE_QUEUED);
  // A session whose only region of its own is NAMED like the client library's block-table
  // region is a tenant as well: the library's region is known by RegionSpec.library_region,
  // which the daemon limits, not by its name (before, the name alone let a root tenant cancel).
  auto named = client::Client::Connect(daemon.socket());
  REQUIRE(named.ok());
  auto named_buffer = (*named)->CreateHostBuffer(1 << 20);
  REQUIRE(named_buffer.ok());
  v1::RegionSpec named_spec;
  named_spec.set_name(client::kBlockTableRegionName);
  named_spec.set_writable(true);
  REQUIRE((*named)->RegisterHostBuffer(**named_buffer, named_spec).ok());
  auto named_cancel = (*named)->Cancel(t->transfer_id());
  INFO(named_cancel.status().ToString());
  CHECK(named_cancel.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK((*c)->Get(t->transfer_id())->state() == v1::TRANSFER_STATE_QUEUED);
  // The flag cannot make a tenant's memory "the library's": one per session (Connect already
  // registered this session's), and never a transfer's source or destination.
  v1::RegionSpec flagged = named_spec;
  flagged.set_library_region(true);
  auto second = (*named)->RegisterHostBuffer(**named_buffer, flagged);
  CHECK(second.status().code() == absl::StatusCode::kAlreadyExists);
  named->reset();

  CommandResult cancelled = Cli(daemon, {"transfers", "cancel", id});
  INFO(cancelled.out << cancelled.err);
  if (::geteuid() != 0) {
    // kvraild's own uid, not root: it reads every status but cancels only its own (under MPS
    // every inference server runs as that uid).
    CHECK(cancelled.exit_code != 0);
    CHECK((*c)->Get(t->transfer_id())->state() == v1::TRANSFER_STATE_QUEUED);
    WARN("not root: checked that kvraild's own uid may not cancel; the root half needs root");
    tenant->reset();
    c->reset();
    CHECK(daemon.Stop(SIGTERM) == 0);
    return;
  }
  CHECK(cancelled.exit_code == 0);
  CHECK(cancelled.out == "transfer " + id + ": cancelled\n");
  CHECK((*c)->Get(t->transfer_id())->state() == v1::TRANSFER_STATE_CANCELLED);

  // The audit line names the operator's uid, its session and the submitter's.
  bool audited = false;
  std::istringstream lines(daemon.ReadLog());
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] != '{') continue;
    auto j = nlohmann::json::parse(line);
    if (j["msg"] != "audit: the operator cancels another session's transfer") continue;
    audited = true;
    CHECK(j["level"] == "warning");
    CHECK(j["operator_uid"] == static_cast<int64_t>(::geteuid()));
    CHECK(j["transfer_id"] == t->transfer_id());
    CHECK(j["operator_session"] != j["submitter_session"]);
    CHECK(j["state"] == "TRANSFER_STATE_QUEUED");
  }
  CHECK(audited);
  tenant->reset();
  c->reset();
  CHECK(daemon.Stop(SIGTERM) == 0);
}

}  // namespace
}  // namespace kvrail::testing
