// A cap on the share of one thread's time that it spends spinning (polling without sleeping:
// the session poll thread for the next packet or submission queue entry, a GPU's dispatcher for
// its next job). A spin saves the wake-up of a thread that sleeps (tens of microseconds on a
// loaded machine, 150-190 us from a deep CPU idle state) but burns a core while nothing comes:
// at a decode cadence (one transfer every few milliseconds) an unbounded spin after each
// transfer costs several percent of a core for nothing. The budget
// is a token bucket over time: it fills at `share` of the time that passes (at most `share` x
// `window` banked) and each spin draws what it spent; a thread spins only while the bucket is
// not empty. Over any stretch of time T the time spent spinning is then at most share x T plus
// share x window plus one spin round.
//
// A thread whose spins often find work (the poll thread under back-to-back transfers) need not
// pay for the short ones: it holds each polling round (Held) while its spin goes on, and the
// spin's end decides - found work (Found(free)): up to `free` of what it held is released, not
// drawn, since that spin saved a wake-up on the critical path, and the rest is drawn; ended with
// nothing, the thread going to sleep (Settle): all it held is drawn. Allows counts what the spin
// holds, so a spin ends once it would overdraw the bucket: a spinner that shares its core with
// the thread it waits for (which cannot run while it spins) is cut as soon as the bucket is
// spent, not after a whole spin. Over any stretch T the time drawn is then at most share x T
// plus share x window plus one round, and the time released at most `free` per find:
// back-to-back traffic (gaps within `free`) keeps the thread awake whatever the share, while a
// long spin meant to cover a cadence's gap is paid from the budget as before.
//
// Probe, describe, compute: the caller reads the clock and passes it in; the class is pure
// arithmetic over those readings (unit tested with an injected clock).
//
// Thread contract: not thread-safe; one thread (the one that spins) owns it.
#pragma once

#include <cstdint>

#include "absl/time/time.h"

namespace kvrail {

// An adaptive spin's next length, from its longest `max`, its length now and how long the wait
// it served took until its answer came (`waited`, whether the spin still ran then or the thread
// had gone to sleep): an answer within `max` gets the full spin next time, since a full spin
// would have caught it; a longer wait halves the spin, down to an eighth of `max`. (Halving on
// every wait the spin missed kept a spin shorter than the answer's usual time short for good:
// it could never catch an answer again, so every wait slept.)
absl::Duration NextSpin(absl::Duration max, absl::Duration current, absl::Duration waited);

class SpinBudget {
 public:
  // `share` of the time in [0, 1] (>= 1: no cap, <= 0: never spins); `window` > 0 bounds the
  // unused budget banked, as share x window. The bucket starts full at `start`.
  SpinBudget(double share, absl::Duration window, absl::Time start);

  // Whether a spin may go on at `now`: the bucket, less what the spin under way holds (Held), is
  // not empty.
  bool Allows(absl::Time now);
  // How long a spin that begins at `now` may go on before the bucket is empty, the bucket
  // refilling meanwhile: tokens / (1 - share). Infinite without a cap, zero once it is spent.
  // A spin that ends by then and is charged with Spent leaves the bucket at or above zero.
  absl::Duration Allowance(absl::Time now);
  // The thread spun from `from` to `to` for nothing: drawn from the bucket (nothing when `to`
  // is not after `from`).
  void Spent(absl::Time from, absl::Time to);
  // The thread polled from `from` to `to` and found nothing: held against the bucket until the
  // spin ends (nothing when `to` is not after `from`).
  void Held(absl::Time from, absl::Time to);
  // The spin found work: up to `free` of what it held is released, the rest drawn.
  void Found(absl::Duration free);
  // The spin ended with nothing (the thread goes to sleep): what it held is drawn. Returns that
  // time (zero when nothing was held).
  absl::Duration Settle();

  bool capped() const { return share_ < 1.0; }
  // Spin time drawn so far, spin time released (Found), and the times Allows said no (stats,
  // tests).
  absl::Duration spent() const { return spent_; }
  absl::Duration released() const { return released_; }
  uint64_t refusals() const { return refusals_; }

 private:
  void Refill(absl::Time now);

  const double share_;
  const absl::Duration cap_;
  absl::Duration tokens_;
  absl::Duration held_ = absl::ZeroDuration();  // by the spin under way (Held)
  absl::Time filled_at_;
  absl::Duration spent_ = absl::ZeroDuration();
  absl::Duration released_ = absl::ZeroDuration();
  uint64_t refusals_ = 0;
};

}  // namespace kvrail
