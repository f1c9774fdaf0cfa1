// ThreadSanitizer support for Debian's absl (--config=tsan only, linked into every binary through
// .bazelrc's --custom_malloc). absl::Mutex, CondVar and Notification live in Debian's
// libabsl_synchronization.so, which is not built with TSan: TSan would see none of the
// happens-before edges they create and report every ABSL_GUARDED_BY field as a race. This shim
// defines the library's entry points in the executable itself (which takes precedence over the
// shared library for the executable's calls), calls the real ones (dlsym RTLD_NEXT) and tells TSan
// what they mean: a lock acquires the mutex's address, an unlock releases it, a wait releases then
// acquires, a notification releases and its waiters acquire.
// The symbol names are those of Debian 12's absl 20220623 (inline namespace debian3); another
// absl fails at start with a message naming the symbol.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);

namespace {

void* Real(const char* name) {
  void* p = ::dlsym(RTLD_NEXT, name);
  if (p == nullptr) {
    std::fprintf(stderr, "absl_tsan_shim: %s not found in the absl libraries\n", name);
    std::abort();
  }
  return p;
}

using M = absl::Mutex;
using C = absl::Condition;
using CV = absl::CondVar;
using N = absl::Notification;

// A Condition is evaluated while its mutex is held, by the waiting thread or by whichever thread
// unlocks; inside the library, where TSan sees no lock. Each condition handed to the library is
// wrapped so its evaluation acquires the mutex before and releases it after.
struct Wrapped {
  const C* condition;
  M* mu;
};
Wrapped Wrap(const C& c, M* m) { return Wrapped{&c, m}; }
bool EvalUnderMutex(void* arg) {
  Wrapped* w = static_cast<Wrapped*>(arg);
  __tsan_acquire(w->mu);
  const bool r = w->condition->Eval();
  __tsan_release(w->mu);
  return r;
}

}  // namespace

// Each wrapper: a declaration giving it the library symbol's name, then its body.
#define KVRAIL_SHIM(ret, wrapper, sym, params, args, before, after) \
  ret wrapper params __asm__(sym);                                  \
  ret wrapper params {                                              \
    using Fn = ret(*) params;                                       \
    static const Fn real = reinterpret_cast<Fn>(Real(sym));         \
    before;                                                         \
    ret r = real args;                                              \
    after;                                                          \
    return r;                                                       \
  }
#define KVRAIL_SHIM_VOID(wrapper, sym, params, args, before, after) \
  void wrapper params __asm__(sym);                                 \
  void wrapper params {                                             \
    using Fn = void(*) params;                                      \
    static const Fn real = reinterpret_cast<Fn>(Real(sym));         \
    before;                                                         \
    real args;                                                      \
    after;                                                          \
  }

#define NOTHING (void)0

// Mutex: locks acquire, unlocks release; a failed try-lock acquires nothing.
KVRAIL_SHIM_VOID(ShimLock, "_ZN4absl7debian35Mutex4LockEv", (M * m), (m), NOTHING,
                 __tsan_acquire(m))
KVRAIL_SHIM_VOID(ShimReaderLock, "_ZN4absl7debian35Mutex10ReaderLockEv", (M * m), (m), NOTHING,
                 __tsan_acquire(m))
KVRAIL_SHIM_VOID(ShimUnlock, "_ZN4absl7debian35Mutex6UnlockEv", (M * m), (m), __tsan_release(m),
                 NOTHING)
KVRAIL_SHIM_VOID(ShimReaderUnlock, "_ZN4absl7debian35Mutex12ReaderUnlockEv", (M * m), (m),
                 __tsan_release(m), NOTHING)
KVRAIL_SHIM(bool, ShimTryLock, "_ZN4absl7debian35Mutex7TryLockEv", (M * m), (m), NOTHING,
            if (r) __tsan_acquire(m))
KVRAIL_SHIM(bool, ShimReaderTryLock, "_ZN4absl7debian35Mutex13ReaderTryLockEv", (M * m), (m),
            NOTHING, if (r) __tsan_acquire(m))
KVRAIL_SHIM_VOID(ShimLockWhen, "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE",
                 (M * m, const C& c), (m, C(&EvalUnderMutex, &w)), Wrapped w = Wrap(c, m),
                 __tsan_acquire(m))
KVRAIL_SHIM_VOID(ShimReaderLockWhen, "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE",
                 (M * m, const C& c), (m, C(&EvalUnderMutex, &w)), Wrapped w = Wrap(c, m),
                 __tsan_acquire(m))
KVRAIL_SHIM(bool, ShimLockWhenWithTimeout,
            "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE",
            (M * m, const C& c, absl::Duration d), (m, C(&EvalUnderMutex, &w), d),
            Wrapped w = Wrap(c, m), __tsan_acquire(m))
KVRAIL_SHIM(bool, ShimLockWhenWithDeadline,
            "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE",
            (M * m, const C& c, absl::Time t), (m, C(&EvalUnderMutex, &w), t),
            Wrapped w = Wrap(c, m), __tsan_acquire(m))
KVRAIL_SHIM(bool, ShimReaderLockWhenWithTimeout,
            "_ZN4absl7debian35Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE",
            (M * m, const C& c, absl::Duration d), (m, C(&EvalUnderMutex, &w), d),
            Wrapped w = Wrap(c, m), __tsan_acquire(m))
KVRAIL_SHIM(bool, ShimReaderLockWhenWithDeadline,
            "_ZN4absl7debian35Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE",
            (M * m, const C& c, absl::Time t), (m, C(&EvalUnderMutex, &w), t),
            Wrapped w = Wrap(c, m), __tsan_acquire(m))
// Await: the mutex is released while waiting and held again on return.
KVRAIL_SHIM_VOID(ShimAwait, "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE", (M * m, const C& c),
                 (m, C(&EvalUnderMutex, &w)), Wrapped w = Wrap(c, m);
                 __tsan_release(m), __tsan_acquire(m))
KVRAIL_SHIM(bool, ShimAwaitWithTimeout,
            "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE",
            (M * m, const C& c, absl::Duration d), (m, C(&EvalUnderMutex, &w), d),
            Wrapped w = Wrap(c, m);
            __tsan_release(m), __tsan_acquire(m))
KVRAIL_SHIM(bool, ShimAwaitWithDeadline,
            "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE",
            (M * m, const C& c, absl::Time t), (m, C(&EvalUnderMutex, &w), t),
            Wrapped w = Wrap(c, m);
            __tsan_release(m), __tsan_acquire(m))
// CondVar::Wait(mu): releases mu while waiting, holds it again on return.
KVRAIL_SHIM_VOID(ShimCvWait, "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE", (CV * cv, M* m), (cv, m),
                 __tsan_release(m), __tsan_acquire(m))
KVRAIL_SHIM(bool, ShimCvWaitWithTimeout,
            "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE",
            (CV * cv, M* m, absl::Duration d), (cv, m, d), __tsan_release(m), __tsan_acquire(m))
KVRAIL_SHIM(bool, ShimCvWaitWithDeadline,
            "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE",
            (CV * cv, M* m, absl::Time t), (cv, m, t), __tsan_release(m), __tsan_acquire(m))
// Notification: Notify releases; a wait that saw the notification acquires.
KVRAIL_SHIM_VOID(ShimNotify, "_ZN4absl7debian312Notification6NotifyEv", (N * n), (n),
                 __tsan_release(n), NOTHING)
KVRAIL_SHIM_VOID(ShimWaitForNotification, "_ZNK4absl7debian312Notification19WaitForNotificationEv",
                 (const N* n), (n), NOTHING, __tsan_acquire(const_cast<N*>(n)))
KVRAIL_SHIM(bool, ShimWaitForNotificationWithTimeout,
            "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE",
            (const N* n, absl::Duration d), (n, d), NOTHING,
            if (r) __tsan_acquire(const_cast<N*>(n)))
KVRAIL_SHIM(bool, ShimWaitForNotificationWithDeadline,
            "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE",
            (const N* n, absl::Time t), (n, t), NOTHING, if (r) __tsan_acquire(const_cast<N*>(n)))
