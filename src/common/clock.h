// The one way TensorHub code reads the time, so that code with timing policy
// (deadlines, the fetcher) can run on simulated time in tests, the way the
// hub's state machine already takes `now_ms`.
//
// Clock::Real() is the process's monotonic clock (std::chrono::steady_clock);
// FakeClock is a clock a test moves by hand, or (kAdvanceOnWait) one that
// moves on by exactly what the code under test waits. Both are safe to read
// and wait on from any thread; a FakeClock may be advanced from any thread.
#ifndef TENSORHUB_COMMON_CLOCK_H_
#define TENSORHUB_COMMON_CLOCK_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace tensorhub {

class Clock {
 public:
  virtual ~Clock() = default;
  // Milliseconds on a monotonic scale; only differences mean anything.
  virtual int64_t NowMs() const = 0;
  // Waits on `cv` (`lock` held on entry and on return) until it is notified
  // or about `ms` of this clock's time has passed. May return early, as any
  // condition-variable wait may: the caller checks its condition again.
  virtual void WaitFor(std::condition_variable& cv,
                       std::unique_lock<std::mutex>& lock,
                       int64_t ms) const = 0;
  // Blocks the calling thread until `ms` of this clock's time has passed.
  void SleepMs(int64_t ms) const {
    std::mutex mu;
    std::condition_variable cv;  // nobody notifies it: only time ends the sleep
    std::unique_lock<std::mutex> lock(mu);
    const int64_t until_ms = NowMs() + ms;
    for (int64_t now_ms = NowMs(); now_ms < until_ms; now_ms = NowMs()) {
      WaitFor(cv, lock, until_ms - now_ms);
    }
  }
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
  void WaitFor(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
               int64_t ms) const override {
    cv.wait_for(lock, std::chrono::milliseconds(ms));
  }
};

inline const Clock& Clock::Real() {
  static const RealClock clock;
  return clock;
}

// Simulated time. Time never goes back (AdvanceMs ignores negative steps).
//   kStill          time stands still until the test advances it; WaitFor
//                   waits up to `ms` of real time (woken early by the cv),
//                   so waiting code polls until the test moves the clock,
//                   and SleepMs blocks until it does.
//   kAdvanceOnWait  waiting is what moves time: WaitFor and SleepMs advance
//                   the clock by `ms` and return at once. With one thread
//                   that waits (e.g. a fetch with one stream), the code
//                   under test runs on simulated time, deterministically
//                   and in no real time at all.
class FakeClock final : public Clock {
 public:
  enum class Mode { kStill, kAdvanceOnWait };
  explicit FakeClock(int64_t start_ms = 0, Mode mode = Mode::kStill)
      : mode_(mode), now_ms_(start_ms) {}
  int64_t NowMs() const override {
    return now_ms_.load(std::memory_order_acquire);
  }
  void WaitFor(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
               int64_t ms) const override {
    if (mode_ == Mode::kAdvanceOnWait) {
      Advance(ms);
      return;
    }
    cv.wait_for(lock, std::chrono::milliseconds(ms));
  }
  void AdvanceMs(int64_t ms) { Advance(ms); }

 private:
  // const: a kAdvanceOnWait clock moves when code holding a `const Clock&`
  // waits on it.
  void Advance(int64_t ms) const {
    if (ms > 0) now_ms_.fetch_add(ms, std::memory_order_acq_rel);
  }

  const Mode mode_;
  mutable std::atomic<int64_t> now_ms_;
};

}  // namespace tensorhub

#endif  // TENSORHUB_COMMON_CLOCK_H_
