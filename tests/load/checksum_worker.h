// A client of kvraild that runs checksummed transfers on its own connection and session, for
// the load and flood tests: it registers a read-only source pool and a writable destination
// pool and runs transfers with cancels, deadlines and invalid requests mixed in (out-of-range and
// repeated block ids, unknown regions, another client's region without a grant, a read-only
// destination). It keeps a shadow of what its destination must hold; after every transfer the
// whole destination pool is compared byte for byte: a succeeded transfer wrote exactly its
// blocks, a cancelled or expired one wrote only within its blocks (each byte old or new), a
// refused one wrote nothing. Every broken guarantee is an entry of Tally::errors.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace kvrail::testing {

// An environment variable as a number, or `fallback` when unset or empty.
uint64_t EnvOr(const char* name, uint64_t fallback);
// The VmRSS of process `pid` in KiB (/proc/<pid>/status), or 0.
uint64_t VmRssKib(pid_t pid);

// What one client saw; read on the main thread after its runs.
struct Tally {
  uint64_t succeeded = 0, cancelled = 0, expired = 0, refused = 0, failed_other = 0;
  std::vector<std::string> errors;  // a broken guarantee, described
};

// One client. Thread contract: Setup, Run and TakeLatencies on one thread at a time; the clients
// of one process share a registry of destination ids (each names another's to be refused).
class ChecksumWorker {
 public:
  // Client `index` (its data pattern and random seed) of the daemon at `socket`.
  static std::unique_ptr<ChecksumWorker> Create(const std::string& socket, uint32_t index);
  virtual ~ChecksumWorker() = default;
  // Connects and registers; false (with an error in the tally) when that fails.
  virtual bool Setup() = 0;
  // Runs `ops` operations (60% plain transfers of 1-16 blocks, 12% cancelled, 8% with a 0-2 ms
  // deadline, 20% invalid requests), stopping early after 5 errors; counts each in `done_ops`.
  virtual void Run(uint64_t ops, std::atomic<uint64_t>* done_ops) = 0;
  // The source must never change (it is read-only and only read).
  virtual void CheckSourceUntouched() = 0;
  // Submit-to-end times of the plain transfers (no cancel, no deadline) since the last call.
  virtual std::vector<absl::Duration> TakeLatencies() = 0;
  virtual void Close() = 0;
  virtual const Tally& tally() const = 0;
};

}  // namespace kvrail::testing
