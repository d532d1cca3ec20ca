#include "client/describe.h"

#include <set>
#include <string>

namespace tensorhub::client {

VersionInfo ToVersionInfo(std::string_view model, const Resolved& r) {
  VersionInfo vi;
  vi.model = std::string(model);
  vi.version = r.version;
  vi.state = r.state;
  vi.retained = r.retained;
  if (r.manifest.has_value()) {
    const Manifest& m = *r.manifest;
    vi.group_size = m.group_size();
    vi.parts_published = m.group_size();
    vi.total_bytes = m.total_bytes();
    vi.chunk_bytes = m.chunk_bytes();
    vi.num_chunks = m.num_chunks();
    std::set<std::string> seen;
    for (const PartLayout& p : m.parts()) {
      for (const TensorLayout& t : p.tensors) {
        if (!t.sharded()) {
          vi.tensors.push_back(TensorInfo{t.spec, p.rank, t.bytes});
          continue;
        }
        // A logical tensor held as pieces: once, with its global shape
        // (what a full fetch allocates), at the first part holding some.
        if (!seen.insert(t.spec.name).second) continue;
        TensorSpec global{t.spec.name, t.spec.dtype, t.GlobalShape()};
        vi.tensors.push_back(
            TensorInfo{global, p.rank, global.ByteSize().value()});
      }
      vi.metadata.insert(vi.metadata.end(), p.metadata.begin(),
                         p.metadata.end());
    }
  }
  for (const ResolvedSource& s : r.sources) {
    HolderInfo h;
    h.worker = s.worker;
    h.data_address = s.data_address;
    h.labels = s.labels;
    h.worker_class = s.worker_class;
    for (const auto& [b, e] : s.chunks) h.chunks += e - b;
    h.filling = s.filling;
    vi.holders.push_back(std::move(h));
  }
  vi.num_holders = r.num_holders;
  return vi;
}

}  // namespace tensorhub::client
