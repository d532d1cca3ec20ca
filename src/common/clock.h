// The one way TensorHub code reads the time, so that code with timing policy
// (deadlines, the fetcher) can run on simulated time in tests, the way the
// hub's state machine already takes `now_ms`.
//
// Clock::Real() is the process's monotonic clock (std::chrono::steady_clock);
// FakeClock is a clock a test moves by hand. Both are safe to read from any
// thread; a FakeClock may be advanced from any thread.
#ifndef TENSORHUB_COMMON_CLOCK_H_
#define TENSORHUB_COMMON_CLOCK_H_

#include <atomic>
#include <chrono>
#include <cstdint>

namespace tensorhub {

class Clock {
 public:
  virtual ~Clock() = default;
  // Milliseconds on a monotonic scale; only differences mean anything.
  virtual int64_t NowMs() const = 0;
  // The process's steady clock. Lives for the whole process; never null.
  static const Clock& Real();
};

// steady_clock in milliseconds since its epoch: the scale NowMs() had
// before this seam, so values stay comparable with those callers keep.
class RealClock final : public Clock {
 public:
  int64_t NowMs() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};

inline const Clock& Clock::Real() {
  static const RealClock clock;
  return clock;
}

// Simulated time: stands still until a test advances it. Time never goes
// back (AdvanceMs ignores negative steps).
class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_ms = 0) : now_ms_(start_ms) {}
  int64_t NowMs() const override { return now_ms_.load(std::memory_order_acquire); }
  void AdvanceMs(int64_t ms) {
    if (ms > 0) now_ms_.fetch_add(ms, std::memory_order_acq_rel);
  }

 private:
  std::atomic<int64_t> now_ms_;
};

}  // namespace tensorhub

#endif  // TENSORHUB_COMMON_CLOCK_H_
