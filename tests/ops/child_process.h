// A child process for the hot restart tests: a pipe to its stdin (closing it tells the child to
// finish) and one from its stdout (read line by line). Not thread-safe. The destructor kills a
// child still running (SIGKILL) and reaps it.
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <string>
#include <vector>

namespace kvrail::testing {

class ChildProcess {
 public:
  // Spawns args[0] (a path) with `args`; REQUIREs that it started.
  explicit ChildProcess(const std::vector<std::string>& args);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // The next line of its stdout, without the newline ("" at the end).
  std::string ReadLine();
  void CloseStdin();
  // Waits for it to exit: its exit status, -1 when a signal ended it.
  int Wait();

 private:
  pid_t pid_ = -1;
  int stdin_ = -1;
  FILE* stdout_ = nullptr;
};

}  // namespace kvrail::testing
