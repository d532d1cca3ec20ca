// A point in time by which a wait must end. Every blocking call in TensorHub
// takes one; nothing waits without a deadline.
#ifndef TENSORHUB_COMMON_DEADLINE_H_
#define TENSORHUB_COMMON_DEADLINE_H_

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace tensorhub {

using SteadyClock = std::chrono::steady_clock;

class Deadline {
 public:
  static Deadline AfterMs(int64_t ms) {
    return Deadline(SteadyClock::now() + std::chrono::milliseconds(ms));
  }
  explicit Deadline(SteadyClock::time_point at) : at_(at) {}

  SteadyClock::time_point at() const { return at_; }
  bool expired() const { return SteadyClock::now() >= at_; }
  // Milliseconds left, never negative.
  int64_t remaining_ms() const {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        at_ - SteadyClock::now());
    return std::max<int64_t>(0, left.count());
  }
  // The earlier of this deadline and `ms` from now.
  Deadline Cap(int64_t ms) const {
    return Deadline(std::min(at_, AfterMs(ms).at_));
  }

 private:
  SteadyClock::time_point at_;
};

inline int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             SteadyClock::now().time_since_epoch())
      .count();
}

}  // namespace tensorhub

#endif  // TENSORHUB_COMMON_DEADLINE_H_
