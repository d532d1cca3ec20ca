// Max-min fair sharing of link capacity among flows (progressive filling).
//
// Pure logic, no state between calls: the simulator calls it whenever the
// set of flows or their caps change. Every flow crosses at most kMaxLinks
// links; a flow may also carry its own rate cap (a pipeline gate).
#ifndef TENSORHUB_SIM_MAXMIN_H_
#define TENSORHUB_SIM_MAXMIN_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace tensorhub::sim {

inline constexpr int kMaxLinks = 6;
inline constexpr double kNoCap = std::numeric_limits<double>::infinity();

struct FlowLinks {
  std::array<int32_t, kMaxLinks> link{};
  int32_t n = 0;
  void Add(int32_t l) { link[static_cast<size_t>(n++)] = l; }
};

// Reusable buffers so that repeated calls do not allocate.
struct MaxMinScratch {
  std::vector<double> rem;
  std::vector<int32_t> count;
  std::vector<int32_t> stamp;
  std::vector<int32_t> adj_begin;
  std::vector<int32_t> adj_len;
  std::vector<int32_t> adj;
  std::vector<int32_t> touched;
  std::vector<int32_t> by_cap;
  std::vector<uint8_t> frozen;
};

// rates[i] = the max-min fair rate of flow i over `capacity` (bytes/s per
// link), never above caps[i]. A flow with cap 0 or no links gets its cap
// (0, or kNoCap for a flow that crosses nothing: callers avoid that).
void MaxMinFair(const std::vector<double>& capacity,
                const std::vector<FlowLinks>& flows,
                const std::vector<double>& caps, std::vector<double>* rates,
                MaxMinScratch* scratch);

}  // namespace tensorhub::sim

#endif  // TENSORHUB_SIM_MAXMIN_H_
