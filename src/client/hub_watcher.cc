// HubWatcher (include/tensorhub/client.h): the hub's control plane with no
// worker behind it.
#include <algorithm>

#include "client/client_tls.h"
#include "client/control_plane.h"
#include "client/describe.h"
#include "common/deadline.h"
#include "tensorhub/client.h"

namespace tensorhub {

class HubWatcher::Impl {
 public:
  Impl(std::unique_ptr<client::ControlPlane> hub, std::string first_address,
       client::HubTls tls, int64_t rpc_timeout_ms)
      : hub_(std::move(hub)),
        first_address_(std::move(first_address)),
        tls_(std::move(tls)),
        rpc_timeout_ms_(rpc_timeout_ms) {}
  client::ControlPlane& hub() { return *hub_; }

  // A call that could not reach the hub: if TLS is why (one end without
  // it, a certificate missing or not trusted), says that and what to set,
  // as a worker's registration does; else the call's own error.
  Status Explain(const Status& s) const {
    if (s.code() != StatusCode::kUnavailable &&
        s.code() != StatusCode::kDeadlineExceeded) {
      return s;
    }
    Status why = client::DiagnoseHubTls(
        first_address_, tls_,
        Deadline::AfterMs(std::min<int64_t>(rpc_timeout_ms_, 3000)));
    return why.ok() ? s : why;
  }

 private:
  const std::unique_ptr<client::ControlPlane> hub_;  // thread-safe
  const std::string first_address_;  // of an HA set's list: the first
  const client::HubTls tls_;
  const int64_t rpc_timeout_ms_;
};

Result<std::unique_ptr<HubWatcher>> HubWatcher::Connect(
    const ClientOptions& options) {
  if (options.hub_address.empty()) {
    return InvalidArgument("hub watcher: no hub address");
  }
  if (options.rpc_timeout_ms <= 0) {
    return InvalidArgument("hub watcher: rpc_timeout_ms must be positive");
  }
  TH_ASSIGN_OR_RETURN(client::ClientTls tls, client::LoadClientTls(options));
  const std::string first =
      options.hub_address.substr(0, options.hub_address.find(','));
  auto impl = std::make_unique<Impl>(
      client::MakeGrpcControlPlane(options.hub_address, options.secret,
                                   options.rpc_timeout_ms, tls.hub),
      first, tls.hub, options.rpc_timeout_ms);
  return std::unique_ptr<HubWatcher>(new HubWatcher(std::move(impl)));
}

HubWatcher::HubWatcher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HubWatcher::~HubWatcher() = default;

Result<HubSnapshot> HubWatcher::Snapshot(const SnapshotLimits& limits) {
  Result<HubSnapshot> r = impl_->hub().Snapshot(limits);
  if (!r.ok()) return impl_->Explain(r.status());
  return r;
}

Result<std::vector<ModelInfo>> HubWatcher::List() {
  Result<std::vector<ModelInfo>> r = impl_->hub().List();
  if (!r.ok()) return impl_->Explain(r.status());
  return r;
}

Result<VersionInfo> HubWatcher::Describe(std::string_view model,
                                         Version version) {
  // No worker id: the hub orders the holders for no one in particular.
  Result<client::Resolved> r =
      impl_->hub().Resolve(WorkerId(), std::string(model), version, true);
  if (!r.ok()) return impl_->Explain(r.status());
  return client::ToVersionInfo(model, *r);
}

}  // namespace tensorhub
