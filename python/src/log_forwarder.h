// Routes the C++ library's log lines into Python's `logging` (the
// `tensorhub.native` logger; python/tensorhub/_log.py).
//
// The library logs from its own threads, often with its locks held, so a
// line is never handed to Python on the thread that logs it: that thread
// would have to take the GIL, and a Python thread holding the GIL while it
// waits for one of those locks would deadlock them both. Instead the sink
// (SetLogSink, tensorhub/log_level.h) queues the line (bounded: 10,000
// lines; beyond that lines are counted and dropped, and the count is
// logged) and one drainer thread, which holds no library lock, takes the
// GIL and calls the Python emitter. Lines keep their order.
//
// Stop() drains the queue, joins the drainer and gives the lines back to
// stderr; the package calls it from atexit, so the drainer never waits for
// the GIL of an interpreter that is being finalized. In a child made by
// fork() the drainer is started again by the first line logged there.
#ifndef TENSORHUB_PYTHON_LOG_FORWARDER_H_
#define TENSORHUB_PYTHON_LOG_FORWARDER_H_

#include <pybind11/pybind11.h>

#include <cstdint>

namespace tensorhub::python {

// `emit(level: str, file: str, line: int, message: str)`, called with the
// GIL held on the drainer thread. Call with the GIL held.
void StartLogForwarding(pybind11::object emit);
// Call with the GIL held (released while it joins). Idempotent.
void StopLogForwarding();
// Waits (GIL released) until the lines queued so far reached Python;
// false after `timeout_ms`.
bool FlushLogForwarding(int64_t timeout_ms);

}  // namespace tensorhub::python

#endif  // TENSORHUB_PYTHON_LOG_FORWARDER_H_
