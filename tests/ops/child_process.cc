#include "tests/ops/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

extern char** environ;

namespace kvrail::testing {

ChildProcess::ChildProcess(const std::vector<std::string>& args) {
  int in[2], out[2];
  REQUIRE(::pipe2(in, O_CLOEXEC) == 0);
  REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int rc = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(in[0]);
  ::close(out[1]);
  stdin_ = in[1];
  stdout_ = ::fdopen(out[0], "r");
  if (rc != 0) pid_ = -1;
  INFO(args[0]);
  REQUIRE(rc == 0);
}

ChildProcess::~ChildProcess() {
  CloseStdin();
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (stdout_ != nullptr) ::fclose(stdout_);
}

std::string ChildProcess::ReadLine() {
  char line[512];
  if (std::fgets(line, sizeof(line), stdout_) == nullptr) return "";
  std::string text(line);
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

void ChildProcess::CloseStdin() {
  if (stdin_ >= 0) ::close(stdin_);
  stdin_ = -1;
}

int ChildProcess::Wait() {
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace kvrail::testing
