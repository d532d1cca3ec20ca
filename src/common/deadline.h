// A point in time by which a wait must end. Every blocking call in TensorHub
// takes one; nothing waits without a deadline.
//
// A deadline reads the time through a Clock (common/clock.h): the real
// steady clock unless one is given, so a test can run timing policy on a
// FakeClock. The clock must outlive every deadline made on it.
#ifndef TENSORHUB_COMMON_DEADLINE_H_
#define TENSORHUB_COMMON_DEADLINE_H_

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "common/clock.h"

namespace tensorhub {

using SteadyClock = std::chrono::steady_clock;

class Deadline {
 public:
  static Deadline AfterMs(int64_t ms, const Clock& clock = Clock::Real()) {
    return Deadline(NowMsRoundedUp(clock) + ms, clock);
  }
  // `at_ms` on `clock`'s scale.
  static Deadline AtMs(int64_t at_ms, const Clock& clock = Clock::Real()) {
    return Deadline(at_ms, clock);
  }
  // A point of the real steady clock (to the millisecond).
  explicit Deadline(SteadyClock::time_point at)
      : Deadline(
            std::chrono::ceil<std::chrono::milliseconds>(at.time_since_epoch())
                .count(),
            Clock::Real()) {}

  // For waits on std::condition_variable and the like. On a clock other than
  // the real one this is "now plus what is left", a real-time stand-in.
  SteadyClock::time_point at() const {
    if (clock_ == &Clock::Real()) {
      return SteadyClock::time_point(std::chrono::milliseconds(at_ms_));
    }
    return SteadyClock::now() + std::chrono::milliseconds(remaining_ms());
  }
  int64_t at_ms() const { return at_ms_; }
  const Clock& clock() const { return *clock_; }
  bool expired() const { return clock_->NowMs() >= at_ms_; }
  // Milliseconds left, never negative.
  int64_t remaining_ms() const {
    return std::max<int64_t>(0, at_ms_ - clock_->NowMs());
  }
  // At least 1: a timeout to hand a call, where 0 would mean "none".
  int64_t timeout_ms() const { return std::max<int64_t>(1, remaining_ms()); }
  // The earlier of this deadline and `ms` from now (on the same clock).
  Deadline Cap(int64_t ms) const {
    return Deadline(std::min(at_ms_, NowMsRoundedUp(*clock_) + ms), *clock_);
  }

 private:
  // Real time runs on between millisecond ticks: rounding "now" up keeps a
  // deadline made from it from ending early (it may end up to 1 ms late).
  // Simulated time stands on whole milliseconds.
  static int64_t NowMsRoundedUp(const Clock& clock) {
    return clock.NowMs() + (&clock == &Clock::Real() ? 1 : 0);
  }

  Deadline(int64_t at_ms, const Clock& clock) : at_ms_(at_ms), clock_(&clock) {}

  int64_t at_ms_;
  const Clock* clock_;  // not owned
};

// The real clock's milliseconds (see Clock::Real()).
inline int64_t NowMs() { return Clock::Real().NowMs(); }

}  // namespace tensorhub

#endif  // TENSORHUB_COMMON_DEADLINE_H_
