#include "common/log.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "common/mutex.h"

namespace tensorhub {
namespace {

LogLevel LevelFromEnv() {
  const char* v = std::getenv("TENSORHUB_LOG");
  if (v == nullptr) return LogLevel::kInfo;
  if (std::strcmp(v, "debug") == 0) return LogLevel::kDebug;
  if (std::strcmp(v, "warn") == 0) return LogLevel::kWarn;
  if (std::strcmp(v, "error") == 0) return LogLevel::kError;
  return LogLevel::kInfo;
}

std::atomic<int> g_level{static_cast<int>(LevelFromEnv())};
std::atomic<LogSink> g_sink{nullptr};
Mutex g_prefix_mu;
std::string g_prefix TH_GUARDED_BY(g_prefix_mu);

}  // namespace

bool LogEnabled(LogLevel level) {
  return static_cast<int>(level) >= g_level.load(std::memory_order_relaxed);
}

void SetLogLevel(LogLevel level) { g_level = static_cast<int>(level); }

LogLevel GetLogLevel() {
  return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed));
}

void SetLogSink(LogSink sink) { g_sink.store(sink); }

void SetLogPrefix(const char* prefix) {
  MutexLock lock(g_prefix_mu);
  g_prefix = prefix;
}

LogLine::LogLine(LogLevel level, const char* file, int line)
    : level_(level), file_(file), line_(line) {
  static const char kLetters[] = "DIWE";
  const char* base = std::strrchr(file, '/');
  if (base != nullptr) file_ = base + 1;
  auto now = std::chrono::system_clock::now().time_since_epoch();
  long long ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now).count();
  std::string prefix;
  {
    MutexLock lock(g_prefix_mu);
    prefix = g_prefix;
  }
  char stamp[32];
  std::snprintf(stamp, sizeof(stamp), "%02lld:%02lld:%02lld.%03lld",
                (ms / 3600000) % 24, (ms / 60000) % 60, (ms / 1000) % 60,
                ms % 1000);
  out_ << kLetters[static_cast<int>(level_)] << stamp << ' ' << getpid()
       << (prefix.empty() ? "" : " ") << prefix << ' ' << file_ << ':' << line
       << "] ";
  prefix_bytes_ = static_cast<size_t>(out_.tellp());
}

LogLine::~LogLine() {
  if (LogSink sink = g_sink.load(); sink != nullptr) {
    std::string s = out_.str();
    sink(level_, file_, line_, std::string_view(s).substr(prefix_bytes_));
    return;
  }
  out_ << '\n';
  std::string s = out_.str();
  // One write per line keeps lines from different threads apart.
  ssize_t ignored = ::write(STDERR_FILENO, s.data(), s.size());
  (void)ignored;
}

}  // namespace tensorhub
