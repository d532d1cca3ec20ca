#include "client/control_plane.h"

namespace tensorhub::client {

Result<FetchStart> ControlPlane::BeginFetch(
    const WorkerId& reader, const std::string& model, Version version,
    const std::string& group, uint64_t group_step, uint32_t max_sources,
    std::optional<uint64_t> fill_epoch, int64_t timeout_ms,
    bool /*manifest_from_sources: always sent here*/) {
  FetchStart out;
  TH_ASSIGN_OR_RETURN(out.resolved, Resolve(reader, model, version, false,
                                            group, group_step, timeout_ms));
  if (fill_epoch.has_value() && out.resolved.manifest.has_value()) {
    Status s = AddHolder(reader, model, out.resolved.version, *fill_epoch,
                         *out.resolved.manifest, /*filling=*/true, timeout_ms);
    out.filling = s.ok();
    if (!s.ok()) out.fill_detail = s.ToString();
  }
  Result<Scheduled> first = Schedule(reader, model, out.resolved.version, {},
                                     max_sources, timeout_ms);
  if (first.ok()) {
    out.first = std::move(first).value();
  } else {
    out.first_status = first.status();
  }
  return out;
}

}  // namespace tensorhub::client
