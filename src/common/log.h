// Minimal leveled logging to stderr, safe from any thread.
//   TH_LOG(INFO) << "hub listening on " << addr;
// The level comes from TENSORHUB_LOG (debug|info|warn|error), default info.
// A sink (SetLogSink, tensorhub/log_level.h) takes the lines instead of
// stderr: the Python package routes them into its `logging`.
#ifndef TENSORHUB_COMMON_LOG_H_
#define TENSORHUB_COMMON_LOG_H_

#include <sstream>

#include "tensorhub/log_level.h"

namespace tensorhub {

bool LogEnabled(LogLevel level);
void SetLogPrefix(const char* prefix);  // e.g. the process role; copied

class LogLine {
 public:
  LogLine(LogLevel level, const char* file, int line);
  ~LogLine();
  std::ostream& stream() { return out_; }

 private:
  LogLevel level_;
  const char* file_;  // base name
  int line_;
  size_t prefix_bytes_ = 0;  // of out_: the stderr prefix, not for a sink
  std::ostringstream out_;
};

struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace tensorhub

#define TH_LOG_LEVEL_DEBUG ::tensorhub::LogLevel::kDebug
#define TH_LOG_LEVEL_INFO ::tensorhub::LogLevel::kInfo
#define TH_LOG_LEVEL_WARN ::tensorhub::LogLevel::kWarn
#define TH_LOG_LEVEL_ERROR ::tensorhub::LogLevel::kError
// An expression, so it is safe under an unbraced `if`: `&` binds looser than
// `<<`, so the whole line is streamed before it is voided.
#define TH_LOG(level)                                                      \
  !::tensorhub::LogEnabled(TH_LOG_LEVEL_##level)                           \
      ? (void)0                                                            \
      : ::tensorhub::LogVoidify() &                                        \
            ::tensorhub::LogLine(TH_LOG_LEVEL_##level, __FILE__, __LINE__) \
                .stream()

#endif  // TENSORHUB_COMMON_LOG_H_
