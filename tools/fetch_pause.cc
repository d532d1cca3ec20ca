#include "fetch_pause.h"

#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

#include "common/test_point.h"

namespace tensorhub::cli {

constexpr char kPoint[] = "fetcher.chunk_done";

FetchPause::FetchPause(uint64_t after_chunks,
                       std::function<void(uint64_t)> paused,
                       std::function<void()> resume, int quiet_streams)
    : after_chunks_(after_chunks),
      paused_(std::move(paused)),
      resume_(std::move(resume)),
      quiet_streams_(quiet_streams) {
  testpoint::Arm(kPoint, [this](uint64_t n) { OnChunk(n); });
}

FetchPause::~FetchPause() { testpoint::Disarm(kPoint); }

std::unique_ptr<FetchPause> FetchPause::OnStdio(uint64_t after_chunks) {
  if (after_chunks == 0) return nullptr;
  return std::make_unique<FetchPause>(
      after_chunks,
      [](uint64_t n) {
        std::fprintf(stderr, "paused after %llu chunks\n",
                     static_cast<unsigned long long>(n));
        std::fflush(stderr);
      },
      [] {
        std::string line;
        std::getline(std::cin, line);
      });
}

uint64_t FetchPause::paused_at() const {
  std::lock_guard<std::mutex> l(mu_);
  return paused_at_;
}

int FetchPause::streams_quiet() const {
  std::lock_guard<std::mutex> l(mu_);
  return streams_quiet_;
}

void FetchPause::OnChunk(uint64_t chunks_done) {
  std::unique_lock<std::mutex> l(mu_);
  if (phase_ == Phase::kReleased || chunks_done < after_chunks_) return;
  ++waiting_;
  arrived_.notify_all();
  if (phase_ == Phase::kPaused) {
    // Another stream is waiting for the test: this one waits with it, as
    // long as resume_() blocks (which the caller bounds, e.g. by EOF).
    released_.wait(l, [this] { return phase_ == Phase::kReleased; });
    return;
  }
  phase_ = Phase::kPaused;
  paused_at_ = chunks_done;
  if (quiet_streams_ > 0) {
    arrived_.wait_for(l, std::chrono::milliseconds(kGatherMs),
                      [this] { return waiting_ >= quiet_streams_; });
  }
  streams_quiet_ = waiting_;
  l.unlock();
  paused_(chunks_done);
  resume_();
  l.lock();
  phase_ = Phase::kReleased;
  released_.notify_all();
}

}  // namespace tensorhub::cli
