// The manifest from a source (docs/design.md, "The manifest from a
// source"): FetchSession::TakeManifest.
#include <string>

#include "client/fetch/fetch_session.h"
#include "common/log.h"
#include "wire/proto_convert.h"

namespace tensorhub::client {
namespace {

// Sources asked for the manifest before the hub is.
constexpr int kManifestSourcesTried = 3;

// One read of a source's manifest part, checked and decoded.
Result<Manifest> ReadManifest(transport::Transport& transport,
                              const FetchSource& src, const std::string& model,
                              Version v, const ManifestRef& ref,
                              const Deadline& d) {
  TH_ASSIGN_OR_RETURN(std::unique_ptr<transport::Connection> conn,
                      transport.Connect(src.address, d));
  wire::ReadRequest req;
  req.model = model;
  req.version = v.value();
  req.epoch = src.epoch;
  req.part = wire::kManifestPart;
  req.length = ref.size;
  std::string bytes(ref.size, '\0');
  const iovec dest{bytes.data(), bytes.size()};
  TH_RETURN_IF_ERROR(conn->Read(req, {&dest, 1}, d));
  if (wire::Sha256Of(bytes) != ref.sha256) {
    return DataLoss(
        "the manifest it served is not the one the hub named (SHA-256 "
        "differs)");
  }
  return wire::DecodeManifest(bytes, "the manifest it served");
}

}  // namespace

// The hub named the manifest by its SHA-256 instead of sending it: read it
// from the first of the hub's sources that serves it (wire::kManifestPart),
// checked against the SHA-256; if none of the first few does, from the hub
// (Resolve), with a warning that says why. A wrong manifest is never taken.
Status FetchSession::TakeManifest() {
  Resolved& r = start_.resolved;
  if (r.manifest.has_value()) {
    ctx_.metrics.ManifestTaken(/*from_source=*/false);
    return Status::Ok();
  }
  if (!start_.manifest_ref.has_value()) {
    return Internal("the hub resolved " + name_ + " without a manifest");
  }
  const ManifestRef& ref = *start_.manifest_ref;
  std::string failures;
  int tried = 0;
  for (const FetchSource& src :
       ctx_.addresses.ToSources(start_.first.sources)) {
    if (src.slices != nullptr) continue;  // holds boxes, not the manifest
    if (tried++ == kManifestSourcesTried || work_.remaining_ms() < 2) break;
    // Each try gets a share of the time left, so that the hub remains to be
    // asked.
    const Deadline d = Deadline::AfterMs(
        std::max<int64_t>(1, work_.remaining_ms() / 3), ctx_.clock);
    Result<Manifest> m =
        ReadManifest(ctx_.transport, src, model_, version_, ref, d);
    if (m.ok()) {
      r.manifest = std::move(m).value();
      manifest_source_ = src.address;
      manifest_bytes_ = ref.size;
      ctx_.metrics.ManifestTaken(/*from_source=*/true, ref.size);
      return Status::Ok();
    }
    failures += (failures.empty() ? "" : "; ") + src.address + ": " +
                m.status().ToString();
  }
  TH_LOG(WARN) << "fetch " << name_
               << ": taking the manifest from the hub, as no source served it ("
               << (failures.empty() ? "the hub listed none" : failures) << ")";
  Result<Resolved> again = ctx_.hub.Resolve(
      ctx_.membership.id(), model_, version_, /*include_uncommitted=*/false, "",
      0, work_.timeout_ms());
  if (!again.ok()) {
    return again.status().WithContext(
        "fetch " + name_ + ": the manifest (no source served it: " + failures +
        ")");
  }
  if (!again->manifest.has_value()) {
    return Internal("the hub resolved " + name_ + " without a manifest");
  }
  r.manifest = std::move(again->manifest);
  ctx_.metrics.ManifestTaken(/*from_source=*/false);
  return Status::Ok();
}

}  // namespace tensorhub::client
