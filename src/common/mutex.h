// A mutex and its scoped lock that clang's thread-safety analysis
// (-Wthread-safety) understands, and the macros that state which lock
// guards which field. std::mutex carries no such annotations in libstdc++,
// so a "guarded by mu_" comment could not be checked; with these it is: a
// clang build with TH_THREAD_SAFETY=ON (scripts/test.sh's ThreadSanitizer
// build) fails on a guarded field read or written without its lock.
//
//   Mutex mu_;
//   int count_ TH_GUARDED_BY(mu_);
//   void Bump() { MutexLock lock(mu_); ++count_; }
//   void BumpLocked() TH_REQUIRES(mu_);   // the caller holds mu_
//
// Waiting on a condition variable: `cv.wait(lock.native(), pred)`; write
// the predicate as `[&]() TH_REQUIRES(mu_) { ... }`, since the analysis
// sees a lambda as a function of its own. Other compilers (GCC, nvcc) see
// plain std::mutex and std::unique_lock, the macros expanding to nothing.
//
// Thread-safety: the usual of a mutex. A MutexLock belongs to one thread.
#ifndef TENSORHUB_COMMON_MUTEX_H_
#define TENSORHUB_COMMON_MUTEX_H_

#include <mutex>

#if defined(__clang__) && !defined(__CUDA__)
#define TH_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define TH_THREAD_ANNOTATION_(x)
#endif

#define TH_CAPABILITY(x) TH_THREAD_ANNOTATION_(capability(x))
#define TH_SCOPED_CAPABILITY TH_THREAD_ANNOTATION_(scoped_lockable)
#define TH_GUARDED_BY(x) TH_THREAD_ANNOTATION_(guarded_by(x))
#define TH_PT_GUARDED_BY(x) TH_THREAD_ANNOTATION_(pt_guarded_by(x))
#define TH_REQUIRES(...) TH_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define TH_EXCLUDES(...) TH_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
#define TH_ACQUIRE(...) TH_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define TH_RELEASE(...) TH_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define TH_NO_THREAD_SAFETY_ANALYSIS \
  TH_THREAD_ANNOTATION_(no_thread_safety_analysis)

namespace tensorhub {

class TH_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() TH_ACQUIRE() { mu_.lock(); }
  void Unlock() TH_RELEASE() { mu_.unlock(); }

 private:
  friend class MutexLock;
  std::mutex mu_;
};

// Holds `mu` from construction to destruction, or between Unlock() and
// Lock() calls made in between (to call out without the lock).
class TH_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) TH_ACQUIRE(mu) : lock_(mu.mu_) {}
  ~MutexLock() TH_RELEASE() = default;
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() TH_RELEASE() { lock_.unlock(); }
  void Lock() TH_ACQUIRE() { lock_.lock(); }
  // For std::condition_variable's waits, which release and retake it.
  std::unique_lock<std::mutex>& native() { return lock_; }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace tensorhub

#endif  // TENSORHUB_COMMON_MUTEX_H_
