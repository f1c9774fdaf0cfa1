#include "tests/harness/daemon_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "client/kvrail_client.h"

extern char** environ;

namespace kvrail::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string templ = std::string(base != nullptr ? base : "/tmp") + "/kvr.XXXXXX";
  // unix socket paths are limited to 108 bytes: fall back to /tmp when TEST_TMPDIR is deep.
  if (templ.size() > 60) templ = "/tmp/kvr.XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  path_ = ::mkdtemp(buf.data());
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string RunfilePath(const std::string& workspace_relative) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir != nullptr && workspace != nullptr) {
    std::string p = std::string(srcdir) + "/" + workspace + "/" + workspace_relative;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  // A binary run directly: its runfiles tree sits beside it.
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    self[n] = '\0';
    std::string p = std::string(self) + ".runfiles/kvrail/" + workspace_relative;
    if (::access(p.c_str(), X_OK) == 0) return p;
    // A packed binary (tests/gpu/pack.sh): the programs lie beside it in bin/.
    const std::string exe(self);
    const std::string dir = exe.substr(0, exe.rfind('/') + 1);
    p = dir + workspace_relative.substr(workspace_relative.rfind('/') + 1);
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return workspace_relative;  // a test's working directory is the runfiles root
}

bool DaemonProcess::Start(const std::string& dir, const std::vector<std::string>& extra_args,
                          bool probe, const std::string& log_name, int wait_ms) {
  socket_ = dir + "/kvrail.sock";
  log_ = dir + "/" + log_name;
  std::vector<std::string> args = {RunfilePath("daemon/kvraild"), "--socket", socket_,
                                   "--log-level", log_level_};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  // The log is appended to across restarts: only this start's "ready: " counts.
  const size_t logged_before = ReadLog().size();
  const int rc = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return false;
  for (int i = 0; i < wait_ms / 10; ++i) {
    int status;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return false;
    }
    // The daemon logs "ready:" once it serves; connecting earlier would put the gRPC channel into
    // reconnect back-off (a second or more).
    if (ReadLog().find("ready: ", logged_before) != std::string::npos) {
      if (!probe) return true;
      auto client = client::Client::Connect(socket_, absl::Milliseconds(500));
      if (client.ok()) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

int DaemonProcess::Stop(int signal, int timeout_ms) {
  if (pid_ < 0) return -1;
  if (signal != 0) ::kill(pid_, signal);
  for (int waited = 0; waited < timeout_ms; waited += 10) {
    int status;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
  return -1;
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
}

std::string DaemonProcess::ReadLog() const {
  std::ifstream in(log_);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

CommandResult RunCommand(const std::vector<std::string>& args) {
  TempDir dir;
  const std::string out_path = dir.path() + "/out", err_path = dir.path() + "/err";
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT, 0644);
  pid_t pid;
  CommandResult result;
  if (posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) == 0) {
    int status;
    ::waitpid(pid, &status, 0);
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  posix_spawn_file_actions_destroy(&actions);
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

std::string HttpGet(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "";
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  if (::write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    ::close(fd);
    return "";
  }
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
  ::close(fd);
  return out;
}

v1::PagedKvLayout MakeLayout(uint32_t layers, uint32_t parts, uint32_t blocks, uint32_t tpb,
                             uint32_t heads, uint32_t head_dim, v1::DType dtype,
                             v1::LayoutOrder order) {
  v1::PagedKvLayout layout;
  layout.set_num_layers(layers);
  layout.set_num_parts(parts);
  layout.set_num_blocks(blocks);
  layout.set_tokens_per_block(tpb);
  layout.set_num_heads(heads);
  layout.set_head_dim(head_dim);
  layout.set_dtype(dtype);
  layout.set_order(order);
  return layout;
}

uint64_t LayoutBytes(const v1::PagedKvLayout& layout) {
  auto bytes = client::PagedLayoutBytes(layout);
  return bytes.ok() ? *bytes : 0;
}

uint64_t ElementOffset(const v1::PagedKvLayout& layout, uint32_t layer, uint32_t part,
                       uint32_t block, uint32_t slot, uint32_t head) {
  auto strides = client::ResolveStrides(layout);
  return client::PagedOffset(layout, *strides, layer, part, block, slot, head);
}

uint8_t PatternByte(uint32_t seed, uint32_t layer, uint32_t part, uint64_t token, uint32_t head,
                    uint32_t byte) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ (uint64_t{layer} << 40) ^ (uint64_t{part} << 36) ^
               (token << 12) ^ (uint64_t{head} << 8) ^ byte;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<uint8_t>(x);
}

}  // namespace kvrail::testing
