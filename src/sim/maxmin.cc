#include "sim/maxmin.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <utility>

#include "tensorhub/check.h"

namespace tensorhub::sim {

// Long on purpose (about 115 lines): one progressive-filling pass, the
// simulator's hot loop, over scratch arrays its phases share; split, each
// step would pass those arrays around and the pass would read less plainly.
void MaxMinFair(const std::vector<double>& capacity,
                const std::vector<FlowLinks>& flows,
                const std::vector<double>& caps, std::vector<double>* rates,
                MaxMinScratch* s) {
  const size_t nf = flows.size();
  const size_t nl = capacity.size();
  TH_CHECK_EQ(caps.size(), nf);
  rates->assign(nf, 0.0);
  if (s->rem.size() < nl) {
    s->rem.assign(nl, 0.0);
    s->count.assign(nl, 0);
    s->stamp.assign(nl, 0);
    s->adj_begin.assign(nl, 0);
    s->adj_len.assign(nl, 0);
  }
  s->frozen.assign(nf, 0);
  s->touched.clear();
  size_t unfrozen = 0;
  for (size_t i = 0; i < nf; ++i) {
    if (caps[i] <= 0.0 || flows[i].n == 0) {
      (*rates)[i] = flows[i].n == 0 ? caps[i] : 0.0;
      s->frozen[i] = 1;
      continue;
    }
    ++unfrozen;
    for (int k = 0; k < flows[i].n; ++k) {
      size_t l = static_cast<size_t>(flows[i].link[static_cast<size_t>(k)]);
      if (s->count[l]++ == 0) s->touched.push_back(static_cast<int32_t>(l));
    }
  }
  // Adjacency (CSR) over the touched links only.
  int32_t pos = 0;
  for (int32_t li : s->touched) {
    size_t l = static_cast<size_t>(li);
    s->adj_begin[l] = pos;
    s->adj_len[l] = 0;
    pos += s->count[l];
    s->rem[l] = capacity[l];
    s->stamp[l] = 0;
  }
  s->adj.resize(static_cast<size_t>(pos));
  for (size_t i = 0; i < nf; ++i) {
    if (s->frozen[i]) continue;
    for (int k = 0; k < flows[i].n; ++k) {
      size_t l = static_cast<size_t>(flows[i].link[static_cast<size_t>(k)]);
      s->adj[static_cast<size_t>(s->adj_begin[l] + s->adj_len[l]++)] =
          static_cast<int32_t>(i);
    }
  }
  // Flows with a finite cap, smallest first.
  s->by_cap.clear();
  for (size_t i = 0; i < nf; ++i) {
    if (!s->frozen[i] && caps[i] < kNoCap) {
      s->by_cap.push_back(static_cast<int32_t>(i));
    }
  }
  std::sort(s->by_cap.begin(), s->by_cap.end(), [&](int32_t a, int32_t b) {
    return caps[static_cast<size_t>(a)] < caps[static_cast<size_t>(b)];
  });
  size_t cap_pos = 0;
  // Min-heap of (fair share left, link, stamp); stale entries are skipped.
  using Entry = std::pair<double, std::pair<int32_t, int32_t>>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  auto share = [&](size_t l) {
    return std::max(0.0, s->rem[l]) / static_cast<double>(s->count[l]);
  };
  for (int32_t l : s->touched) {
    heap.push({share(static_cast<size_t>(l)), {l, 0}});
  }
  auto freeze = [&](size_t f, double rate) {
    s->frozen[f] = 1;
    (*rates)[f] = rate;
    --unfrozen;
    for (int k = 0; k < flows[f].n; ++k) {
      size_t l = static_cast<size_t>(flows[f].link[static_cast<size_t>(k)]);
      s->rem[l] -= rate;
      --s->count[l];
      ++s->stamp[l];
      if (s->count[l] > 0) {
        heap.push({share(l), {static_cast<int32_t>(l), s->stamp[l]}});
      }
    }
  };
  while (unfrozen > 0) {
    while (!heap.empty()) {
      size_t l = static_cast<size_t>(heap.top().second.first);
      if (s->count[l] == 0 || heap.top().second.second != s->stamp[l]) {
        heap.pop();
        continue;
      }
      break;
    }
    while (cap_pos < s->by_cap.size() &&
           s->frozen[static_cast<size_t>(s->by_cap[cap_pos])]) {
      ++cap_pos;
    }
    double link_level = heap.empty() ? kNoCap : heap.top().first;
    double cap_level = cap_pos < s->by_cap.size()
                           ? caps[static_cast<size_t>(s->by_cap[cap_pos])]
                           : kNoCap;
    if (cap_level <= link_level) {
      TH_CHECK_LT(cap_pos, s->by_cap.size());
      freeze(static_cast<size_t>(s->by_cap[cap_pos]), cap_level);
      continue;
    }
    TH_CHECK(!heap.empty());
    size_t l = static_cast<size_t>(heap.top().second.first);
    double level = heap.top().first;
    heap.pop();
    // Every unfrozen flow through the bottleneck link gets the level.
    for (int32_t j = 0; j < s->adj_len[l]; ++j) {
      size_t f =
          static_cast<size_t>(s->adj[static_cast<size_t>(s->adj_begin[l] + j)]);
      if (!s->frozen[f]) freeze(f, level);
    }
  }
  // Leave the per-link counters at zero for the next call.
  for (int32_t l : s->touched) s->count[static_cast<size_t>(l)] = 0;
}

}  // namespace tensorhub::sim
