// What `tensorhub top` draws: a hub snapshot (tensorhub/snapshot.h) as
// lines of text. Pure: no I/O, no clock, no terminal; the live view and the
// plain (non-terminal) output both print these lines, and tests compare
// them.
#ifndef TENSORHUB_TOOLS_TOP_VIEW_H_
#define TENSORHUB_TOOLS_TOP_VIEW_H_

#include <cstddef>
#include <string>
#include <vector>

#include "tensorhub/snapshot.h"

namespace tensorhub::cli {

// `title` is the first line (hub address, time, ...). Every line is at most
// `width` columns (longer ones are cut, the last column a '>' marker); at
// most `max_lines` lines (0: no limit), the last one then saying how many
// were left out. Bytes that are not printable ASCII (a worker's name comes
// from the network) are drawn as '?', so nothing can reach the terminal as a
// control sequence. width < 20 is taken as 20.
std::vector<std::string> RenderTop(const HubSnapshot& snapshot,
                                   const std::string& title, size_t width,
                                   size_t max_lines = 0);

}  // namespace tensorhub::cli

#endif  // TENSORHUB_TOOLS_TOP_VIEW_H_
