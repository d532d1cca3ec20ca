// The library's log level. TensorHub logs to stderr, from any thread; the
// level is process-wide.
#ifndef TENSORHUB_LOG_LEVEL_H_
#define TENSORHUB_LOG_LEVEL_H_

namespace tensorhub {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// Messages below `level` are dropped. The default comes from TENSORHUB_LOG
// (debug|info|warn|error), else info. Safe from any thread.
void SetLogLevel(LogLevel level);

}  // namespace tensorhub

#endif  // TENSORHUB_LOG_LEVEL_H_
