#include "log_forwarder.h"

#include <pthread.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "tensorhub/log_level.h"

namespace py = pybind11;

namespace tensorhub::python {
namespace {

constexpr size_t kMaxQueuedLines = 10000;

struct Line {
  LogLevel level;
  std::string file;
  int line;
  std::string message;
};

const char* LevelName(LogLevel l) {
  switch (l) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

// One per process, never destroyed: the sink may be called by library
// threads until the very end of the process.
class Forwarder {
 public:
  static Forwarder& Get() {
    static Forwarder* f = new Forwarder();
    return *f;
  }

  void Start(py::object emit) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!stopped_) return;                    // running already
      emit_ = new py::object(std::move(emit));  // freed by Stop, GIL held
      stopped_ = false;
    }
    SetLogSink(&Forwarder::Sink);
  }

  void Stop() {
    std::unique_ptr<std::thread> t;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stopped_) return;
      stopped_ = true;
      t = std::move(thread_);
    }
    SetLogSink(nullptr);
    work_cv_.notify_all();
    idle_cv_.notify_all();
    if (t != nullptr) {
      py::gil_scoped_release nogil;  // the drainer needs it to finish
      t->join();
    }
    std::lock_guard<std::mutex> l(mu_);
    delete emit_;
    emit_ = nullptr;
  }

  // Waits until every line queued so far was handed to Python (or the
  // deadline passed). Called with the GIL held; releases it while waiting.
  bool Flush(int64_t timeout_ms) {
    py::gil_scoped_release nogil;
    std::unique_lock<std::mutex> l(mu_);
    return idle_cv_.wait_for(l, std::chrono::milliseconds(timeout_ms), [&] {
      return stopped_ || (queue_.empty() && dropped_ == 0 && !emitting_);
    });
  }

  static void Sink(LogLevel level, std::string_view file, int line,
                   std::string_view message) {
    Get().Push(Line{level, std::string(file), line, std::string(message)});
  }

 private:
  Forwarder() {
    pthread_atfork([] { Get().mu_.lock(); }, [] { Get().mu_.unlock(); },
                   [] {
                     Forwarder& f = Get();
                     // The drainer did not come along: forget it (it is
                     // not ours to join) and start another on demand.
                     (void)f.thread_.release();
                     f.queue_.clear();
                     f.mu_.unlock();
                   });
  }

  void Push(Line line) {
    std::lock_guard<std::mutex> l(mu_);
    if (stopped_) return;  // a late line after Stop: dropped
    if (queue_.size() >= kMaxQueuedLines) {
      ++dropped_;
      return;
    }
    queue_.push_back(std::move(line));
    if (thread_ == nullptr) {
      thread_ = std::make_unique<std::thread>([this] { Run(); });
    }
    work_cv_.notify_one();
  }

  void Run() {
    for (;;) {
      std::deque<Line> batch;
      uint64_t dropped = 0;
      {
        std::unique_lock<std::mutex> l(mu_);
        work_cv_.wait(
            l, [&] { return stopped_ || !queue_.empty() || dropped_ > 0; });
        if (queue_.empty() && dropped_ == 0) return;  // stopped, drained
        batch.swap(queue_);
        std::swap(dropped, dropped_);
        emitting_ = true;
      }
      Emit(batch, dropped);
      {
        std::lock_guard<std::mutex> l(mu_);
        emitting_ = false;
      }
      idle_cv_.notify_all();
    }
  }

  void Emit(const std::deque<Line>& batch, uint64_t dropped) {
    py::gil_scoped_acquire gil;
    py::object* emit = emit_;  // only Stop changes it, after joining us
    if (emit == nullptr) return;
    try {
      if (dropped > 0) {
        (*emit)("warn", "log_forwarder.cc", __LINE__,
                std::to_string(dropped) +
                    " log lines dropped: the queue to Python's logging was "
                    "full");
      }
      for (const Line& x : batch) {
        (*emit)(LevelName(x.level), x.file, x.line, x.message);
      }
    } catch (py::error_already_set& e) {
      // A handler that raises must not end the drainer: say so once per
      // batch on stderr, as logging's own handleError does.
      e.discard_as_unraisable("tensorhub log forwarding");
    }
  }

  std::mutex mu_;
  std::condition_variable work_cv_;  // lines queued, or stopping
  std::condition_variable idle_cv_;  // the drainer handed a batch over
  std::deque<Line> queue_;
  uint64_t dropped_ = 0;
  bool stopped_ = true;
  bool emitting_ = false;  // the drainer hands a batch to Python
  std::unique_ptr<std::thread> thread_;
  py::object* emit_ = nullptr;
};

}  // namespace

void StartLogForwarding(py::object emit) {
  Forwarder::Get().Start(std::move(emit));
}

void StopLogForwarding() { Forwarder::Get().Stop(); }

bool FlushLogForwarding(int64_t timeout_ms) {
  return Forwarder::Get().Flush(timeout_ms);
}

}  // namespace tensorhub::python
