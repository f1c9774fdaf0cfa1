#include "daemon/regions/sigbus_guard.h"

#include <signal.h>
#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace kvrail::regions {
namespace {

// One guarded range. `begin` != 0 marks a slot in use; Add writes `end` before `begin`, Remove
// clears `begin` first, so the handler never pairs a begin with a stale end of a live slot.
struct Slot {
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  std::atomic<uint32_t> poisoned{0};
};

// Zero-initialized (static storage), touched only as slots are used: 24 MiB of address space,
// resident only for the slots below the high-water mark.
Slot g_slots[SigbusGuard::kCapacity];
// Slots [0, g_high) may be in use; the handler scans only those.
std::atomic<size_t> g_high{0};
std::atomic<uint64_t> g_faults{0};
struct sigaction g_previous;
std::atomic<bool> g_installed{false};

absl::Mutex g_mu;  // Add, Remove and installing
size_t g_free_hint ABSL_GUARDED_BY(g_mu) = 0;

void Handler(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(info->si_addr);
  // Only faults of the memory itself (not a kill(SIGBUS) from someone) are ours to absorb.
  const bool fault = info->si_code > 0;
  const size_t high = g_high.load(std::memory_order_acquire);
  for (size_t i = 0; fault && i < high; ++i) {
    const uintptr_t begin = g_slots[i].begin.load(std::memory_order_acquire);
    if (begin == 0 || addr < begin) continue;
    const uintptr_t end = g_slots[i].end.load(std::memory_order_acquire);
    if (addr >= end) continue;
    // mmap is a plain system call: safe in a signal handler on Linux.
    void* replaced = ::mmap(reinterpret_cast<void*>(begin), end - begin, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    if (replaced == MAP_FAILED) break;  // cannot absorb it: die as without the guard
    g_slots[i].poisoned.store(1, std::memory_order_release);
    g_faults.fetch_add(1, std::memory_order_relaxed);
    errno = saved_errno;
    return;  // the faulting instruction runs again, now on zero pages
  }
  // Not ours: whatever handled SIGBUS before (by default, the process dies with SIGBUS once the
  // faulting instruction runs again).
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    errno = saved_errno;
    g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN &&
      g_previous.sa_handler != nullptr) {
    errno = saved_errno;
    g_previous.sa_handler(sig);
    return;
  }
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  ::sigaction(SIGBUS, &dfl, nullptr);
  if (!fault) ::raise(SIGBUS);  // a sent signal does not repeat by itself
  errno = saved_errno;
}

absl::Status InstallLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_mu) {
  if (g_installed.load(std::memory_order_relaxed)) return absl::OkStatus();
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_sigaction = Handler;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  if (::sigaction(SIGBUS, &action, &g_previous) != 0) {
    return absl::InternalError(
        absl::StrCat("sigaction(SIGBUS) for the host memory guard failed: ", std::strerror(errno)));
  }
  g_installed.store(true, std::memory_order_relaxed);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<uint32_t> SigbusGuard::Add(void* base, size_t length) {
  absl::MutexLock lock(&g_mu);
  if (absl::Status installed = InstallLocked(); !installed.ok()) return installed;
  const size_t high = g_high.load(std::memory_order_relaxed);
  size_t slot = kCapacity;
  for (size_t i = g_free_hint; i < high; ++i) {
    if (g_slots[i].begin.load(std::memory_order_relaxed) == 0) {
      slot = i;
      break;
    }
  }
  if (slot == kCapacity) {
    if (high == kCapacity) {
      return absl::ResourceExhaustedError(
          absl::StrCat("host mappings: the daemon guards ", kCapacity, " host mappings, its most"));
    }
    slot = high;
  }
  Slot& s = g_slots[slot];
  s.poisoned.store(0, std::memory_order_relaxed);
  s.end.store(reinterpret_cast<uintptr_t>(base) + length, std::memory_order_release);
  s.begin.store(reinterpret_cast<uintptr_t>(base), std::memory_order_release);
  if (slot == high) g_high.store(high + 1, std::memory_order_release);
  g_free_hint = slot + 1;
  return static_cast<uint32_t>(slot);
}

void SigbusGuard::Remove(uint32_t slot) {
  absl::MutexLock lock(&g_mu);
  g_slots[slot].begin.store(0, std::memory_order_release);
  g_slots[slot].end.store(0, std::memory_order_release);
  if (slot < g_free_hint) g_free_hint = slot;
}

bool SigbusGuard::Poisoned(uint32_t slot) {
  return g_slots[slot].poisoned.load(std::memory_order_acquire) != 0;
}

uint64_t SigbusGuard::FaultsCaught() { return g_faults.load(std::memory_order_relaxed); }

}  // namespace kvrail::regions
