// The worker library's composition root. Client::Impl builds one worker
// on its seams (client_deps.h) and wires its units together, each borrowing
// the WorkerContext (worker_context.h), never the Impl:
//   Membership  registration, heartbeats, rejoining a restarted hub, and
//               what the hub must hear later (membership.h)
//   Serving     publish, unpublish and the drain; what fetches serve
//               (serving.h)
//   fetches     one FetchSession per fetch, whole or of slices (fetch/)
// It owns the data server and the metrics endpoint, and answers the calls
// that are a single hub call (List, Retain, Describe) itself.
#include "tensorhub/client.h"

#include <unistd.h>

#include <memory>
#include <set>
#include <string>
#include <utility>

#include "client/addresses.h"
#include "client/client_deps.h"
#include "client/client_metrics.h"
#include "client/control_plane.h"
#include "client/describe.h"
#include "client/fetch/slice_fetch.h"
#include "client/fetch/whole_fetch.h"
#include "client/membership.h"
#include "client/registry.h"
#include "client/serving.h"
#include "client/tensor_checks.h"
#include "client/worker_context.h"
#include "common/log.h"
#include "metrics/metrics.h"
#include "tls/tls.h"

namespace tensorhub {
namespace {

// Refuses (before anything listens: nothing to undo) a data server that
// anyone could read, unless the options say that is wanted.
Status CheckDataPlaneIsProtected(const ClientOptions& o) {
  if (!o.secret.empty() || o.data_tls ||
      tls::IsLoopbackListen(o.data_listen_address)) {
    return Status::Ok();
  }
  const std::string what =
      "data server listening on " + o.data_listen_address +
      " with neither a shared secret nor data-plane TLS: anyone who can "
      "reach it can read every version this worker holds, and the bytes "
      "cross the network in the clear. Fix: the same secret on every "
      "worker and the hub (--secret-file), and --data-tls for links you "
      "do not trust, or listen on 127.0.0.1 (docs/security.md)";
  if (!o.insecure) {
    return FailedPrecondition(
        "refusing to start a " + what +
        ". On a private network where that is acceptable, pass "
        "--insecure (ClientOptions::insecure).");
  }
  TH_LOG(WARN) << what << ". Running anyway: --insecure was given.";
  return Status::Ok();
}

}  // namespace

class Client::Impl {
 public:
  Impl(const ClientOptions& options, client::ClientDeps deps)
      : options_(options),
        clock_(*deps.clock),
        hub_(std::move(deps.control)),
        transport_(std::move(deps.transport)),
        addresses_(options_),
        membership_(options_, *hub_, registry_, addresses_),
        ctx_{options_,  clock_,   *hub_,      *transport_,
             registry_, metrics_, addresses_, membership_},
        serving_(ctx_) {}

  ~Impl() {
    // First: a scrape reads the server and the registry below.
    if (metrics_server_) metrics_server_->Stop();
    // Leave while still serving: the hub may hold the call (renewing our
    // lease) until keepers copied retained versions only we hold.
    membership_.Leave();
    if (server_) server_->Stop();
  }

  Status Start() {
    TH_RETURN_IF_ERROR(CheckDataPlaneIsProtected(options_));
    transport::ServerOptions so;
    so.max_connections = options_.max_serving_connections;
    TH_ASSIGN_OR_RETURN(
        server_,
        transport_->Listen(options_.data_listen_address, &registry_, so));
    addresses_.Set(server_->address(), server_->endpoints());
    if (!options_.metrics_listen.empty()) {
      // Before registering: a port in use fails Connect with nothing to
      // undo. The server holds the collector weakly: it is kept here.
      collector_ = ScrapeTimeCollector();
      TH_ASSIGN_OR_RETURN(
          metrics_server_,
          metrics::MetricsServer::Start(options_.metrics_listen,
                                        {metrics_.registry(), collector_}));
    }
    if (options_.name.empty()) {
      char host[256] = {0};
      ::gethostname(host, sizeof(host) - 1);
      options_.name = std::string(host) + ":" + std::to_string(::getpid());
    }
    return membership_.Join();
  }

  Status Publish(std::string_view model, Version version,
                 const std::vector<TensorRef>& tensors,
                 const PublishOptions& opts) {
    return serving_.Publish(model, version, tensors, opts);
  }
  Status Unpublish(std::string_view model, Version version, int64_t timeout_ms,
                   bool force) {
    return serving_.Unpublish(model, version, timeout_ms, force);
  }
  Result<FetchStats> Fetch(std::string_view model, Version version,
                           const std::vector<TensorRef>& dest,
                           const FetchOptions& opts) {
    return client::FetchWhole(ctx_, serving_, model, version, dest, opts);
  }
  Result<FetchStats> FetchSlices(std::string_view model, Version version,
                                 const std::vector<TensorSlice>& slices,
                                 const FetchOptions& opts) {
    return client::FetchSlices(ctx_, serving_, model, version, slices, opts);
  }

  Result<std::vector<ModelInfo>> List() { return hub_->List(); }

  Status Retain(std::string_view model, Version version, bool retain) {
    if (version.is_latest()) {
      return InvalidArgument("retain needs a version number, not latest");
    }
    return hub_->Retain(std::string(model), version, retain);
  }

  Result<VersionInfo> Describe(std::string_view model, Version version,
                               std::string_view group, uint64_t group_step) {
    TH_RETURN_IF_ERROR(client::CheckReaderGroup(group));
    TH_ASSIGN_OR_RETURN(
        client::Resolved r,
        hub_->Resolve(membership_.id(), std::string(model), version, true,
                      std::string(group), group_step));
    return client::ToVersionInfo(model, r);
  }

  const WorkerId& id() const { return membership_.id(); }
  std::string data_address() const { return addresses_.data_address(); }
  std::string metrics_address() const {
    return metrics_server_ ? metrics_server_->address() : std::string();
  }
  client::ClientMetrics& metrics() { return metrics_; }
  // What GET /metrics answers, with or without a metrics endpoint.
  std::string MetricsText() {
    return metrics::Render({metrics_.registry(), ScrapeTimeCollector()});
  }

 private:
  // The figures the worker keeps anyway, read when scraped (a scrape
  // thread; metrics_server_ stops before what they read goes away).
  std::shared_ptr<metrics::FunctionCollector> ScrapeTimeCollector() {
    return std::make_shared<metrics::FunctionCollector>(
        [this] { return client::ServingFamilies(*server_, registry_); });
  }

  ClientOptions options_;
  const Clock& clock_;  // not owned (ClientDeps::clock)
  std::unique_ptr<client::ControlPlane> hub_;
  std::unique_ptr<transport::Transport> transport_;
  client::Registry registry_;
  client::ClientMetrics metrics_;
  client::Addresses addresses_;
  client::Membership membership_;
  client::WorkerContext ctx_;
  client::Serving serving_;
  std::unique_ptr<transport::Server> server_;
  std::shared_ptr<metrics::FunctionCollector> collector_;
  std::unique_ptr<metrics::MetricsServer> metrics_server_;
};

namespace client {

ClientMetrics& ClientFactory::Metrics(Client& client) {
  return client.impl_->metrics();
}

std::string ClientFactory::MetricsText(Client& client) {
  return client.impl_->MetricsText();
}

Result<std::unique_ptr<Client>> ClientFactory::Connect(
    const ClientOptions& options, ClientDeps deps) {
  if (!deps.transport || !deps.control || deps.clock == nullptr) {
    return InvalidArgument(
        "client: a transport, a control plane and a clock are all needed");
  }
  auto impl = std::make_unique<Client::Impl>(options, std::move(deps));
  TH_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

}  // namespace client

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  TH_ASSIGN_OR_RETURN(client::ClientDeps deps,
                      client::DefaultClientDeps(options));
  return client::ClientFactory::Connect(options, std::move(deps));
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Status Client::Publish(std::string_view model, Version version,
                       const std::vector<TensorRef>& tensors,
                       const PublishOptions& options) {
  return impl_->Publish(model, version, tensors, options);
}

Status Client::Unpublish(std::string_view model, Version version,
                         int64_t timeout_ms, bool force) {
  return impl_->Unpublish(model, version, timeout_ms, force);
}

Status Client::Retain(std::string_view model, Version version) {
  return impl_->Retain(model, version, true);
}

Status Client::Unretain(std::string_view model, Version version) {
  return impl_->Retain(model, version, false);
}

Result<FetchStats> Client::Fetch(std::string_view model, Version version,
                                 const std::vector<TensorRef>& destination,
                                 const FetchOptions& options) {
  return impl_->Fetch(model, version, destination, options);
}

Result<FetchStats> Client::FetchSlices(std::string_view model, Version version,
                                       const std::vector<TensorSlice>& slices,
                                       const FetchOptions& options) {
  return impl_->FetchSlices(model, version, slices, options);
}

Result<std::vector<ModelInfo>> Client::List() { return impl_->List(); }

Result<VersionInfo> Client::Describe(std::string_view model, Version version) {
  return impl_->Describe(model, version, "", 0);
}

Result<VersionInfo> Client::Describe(std::string_view model, Version version,
                                     std::string_view group,
                                     uint64_t group_step) {
  if (group.empty()) return InvalidArgument("reader group id is empty");
  return impl_->Describe(model, version, group, group_step);
}

const WorkerId& Client::id() const { return impl_->id(); }
std::string Client::data_address() const { return impl_->data_address(); }
std::string Client::metrics_address() const { return impl_->metrics_address(); }

}  // namespace tensorhub
