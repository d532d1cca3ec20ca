#include "common/refusal_log.h"

#include <utility>
#include <vector>

#include "common/log.h"

namespace tensorhub {

RefusalLog::RefusalLog(std::string what, int64_t interval_ms, size_t max_peers,
                       const Clock& clock, Sink sink)
    : what_(std::move(what)),
      interval_ms_(interval_ms),
      max_peers_(max_peers),
      clock_(clock),
      sink_(sink ? std::move(sink) : Sink([](const std::string& line) {
        TH_LOG(WARN) << line;
      })) {}

void RefusalLog::Refused(const std::string& peer, const std::string& why) {
  std::vector<std::string> out;
  {
    MutexLock lock(mu_);
    const int64_t now_ms = clock_.NowMs();
    ++refusals_;
    if (now_ms - last_sweep_ms_ >= interval_ms_) Sweep(now_ms, &out);
    const std::string& key =
        peers_.count(peer) > 0 || peers_.size() < max_peers_
            ? peer
            : std::string(kOthers);
    auto it = peers_.find(key);
    if (it == peers_.end()) {
      peers_.emplace(key, Peer{now_ms, 0, why});
      out.push_back(what_ + ": refused " + key + ": " + why);
      ++lines_;
    } else {
      Peer& p = it->second;
      ++p.unreported;
      p.last_why = why;
      if (now_ms - p.window_start_ms >= interval_ms_) {
        out.push_back(Summary(key, p, now_ms));
      }
    }
  }
  Write(out);
}

void RefusalLog::Flush() {
  std::vector<std::string> out;
  {
    MutexLock lock(mu_);
    const int64_t now_ms = clock_.NowMs();
    for (auto& [name, p] : peers_) {
      if (p.unreported > 0) out.push_back(Summary(name, p, now_ms));
    }
  }
  Write(out);
}

uint64_t RefusalLog::refusals() const {
  MutexLock lock(mu_);
  return refusals_;
}

uint64_t RefusalLog::lines() const {
  MutexLock lock(mu_);
  return lines_;
}

std::string RefusalLog::Summary(const std::string& name, Peer& p,
                                int64_t now_ms) {
  const int64_t secs = (now_ms - p.window_start_ms + 999) / 1000;
  std::string line = what_ + ": refused " + name + " " +
                     std::to_string(p.unreported) + " more time" +
                     (p.unreported == 1 ? "" : "s") + " in the last " +
                     std::to_string(secs) + " s (the last: " + p.last_why +
                     "); at most one line per peer every " +
                     std::to_string(interval_ms_ / 1000) + " s";
  p.window_start_ms = now_ms;
  p.unreported = 0;
  ++lines_;
  return line;
}

void RefusalLog::Sweep(int64_t now_ms, std::vector<std::string>* out) {
  last_sweep_ms_ = now_ms;
  for (auto it = peers_.begin(); it != peers_.end();) {
    Peer& p = it->second;
    if (now_ms - p.window_start_ms < interval_ms_) {
      ++it;
    } else if (p.unreported > 0) {
      out->push_back(Summary(it->first, p, now_ms));
      ++it;
    } else {
      it = peers_.erase(it);  // quiet for a whole interval: forgotten
    }
  }
}

void RefusalLog::Write(const std::vector<std::string>& lines) {
  for (const std::string& line : lines) sink_(line);
}

}  // namespace tensorhub
