// The library's log level and where its lines go. TensorHub logs to stderr
// by default, from any thread; the level and the sink are process-wide.
#ifndef TENSORHUB_LOG_LEVEL_H_
#define TENSORHUB_LOG_LEVEL_H_

#include <string_view>

namespace tensorhub {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// Messages below `level` are dropped. The default comes from TENSORHUB_LOG
// (debug|info|warn|error), else info. Safe from any thread.
void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();

// Receives each line at or above the level instead of stderr: the source
// file's base name, its line, and the message without the time/pid prefix
// stderr lines carry. Called on the thread that logs, possibly with the
// library's locks held: it must not block for long nor call back into
// TensorHub (queue the line and return, as the Python binding does).
using LogSink = void (*)(LogLevel level, std::string_view file, int line,
                         std::string_view message);
// nullptr: back to stderr. Safe from any thread; a line being written while
// the sink changes goes to the old or the new one, whole.
void SetLogSink(LogSink sink);

}  // namespace tensorhub

#endif  // TENSORHUB_LOG_LEVEL_H_
