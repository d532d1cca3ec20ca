// HubWatcher (include/tensorhub/client.h): the hub's control plane with no
// worker behind it.
#include "client/client_tls.h"
#include "client/control_plane.h"
#include "client/describe.h"
#include "tensorhub/client.h"

namespace tensorhub {

class HubWatcher::Impl {
 public:
  explicit Impl(std::unique_ptr<client::ControlPlane> hub)
      : hub_(std::move(hub)) {}
  client::ControlPlane& hub() { return *hub_; }

 private:
  const std::unique_ptr<client::ControlPlane> hub_;  // thread-safe
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
  auto impl = std::make_unique<Impl>(
      client::MakeGrpcControlPlane(options.hub_address, options.secret,
                                   options.rpc_timeout_ms, std::move(tls.hub)));
  return std::unique_ptr<HubWatcher>(new HubWatcher(std::move(impl)));
}

HubWatcher::HubWatcher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HubWatcher::~HubWatcher() = default;

Result<HubSnapshot> HubWatcher::Snapshot(const SnapshotLimits& limits) {
  return impl_->hub().Snapshot(limits);
}

Result<std::vector<ModelInfo>> HubWatcher::List() {
  return impl_->hub().List();
}

Result<VersionInfo> HubWatcher::Describe(std::string_view model,
                                         Version version) {
  // No worker id: the hub orders the holders for no one in particular.
  TH_ASSIGN_OR_RETURN(
      client::Resolved r,
      impl_->hub().Resolve(WorkerId(), std::string(model), version, true));
  return client::ToVersionInfo(model, r);
}

}  // namespace tensorhub
