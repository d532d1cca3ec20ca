// A Client whose data server stays reachable from outside, to read the
// bytes it served from its own counter: how a benchmark or a test checks
// what a holder sent, without trusting the reader's account.
#ifndef TENSORHUB_CLIENT_COUNTED_CLIENT_H_
#define TENSORHUB_CLIENT_COUNTED_CLIENT_H_

#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "client/client_deps.h"
#include "tensorhub/client.h"
#include "transport/transport.h"

namespace tensorhub::client {

// Forwards to another transport and keeps the server it listened with.
class ServerKeepingTransport : public transport::Transport {
 public:
  explicit ServerKeepingTransport(std::unique_ptr<transport::Transport> inner)
      : inner_(std::move(inner)) {}
  std::string_view name() const override { return inner_->name(); }
  Result<std::unique_ptr<transport::Server>> Listen(
      const std::string& host_port, transport::ReadSource* source,
      const transport::ServerOptions& options) override {
    auto s = inner_->Listen(host_port, source, options);
    if (s.ok()) *server_ = s->get();
    return s;
  }
  Result<std::unique_ptr<transport::Connection>> Connect(
      const std::string& address, const Deadline& deadline) override {
    return inner_->Connect(address, deadline);
  }
  // Shared with the CountedClient; valid while the client lives.
  std::shared_ptr<transport::Server*> server() const { return server_; }

 private:
  std::unique_ptr<transport::Transport> inner_;
  std::shared_ptr<transport::Server*> server_ =
      std::make_shared<transport::Server*>(nullptr);
};

// Bytes of manifests `c` read from sources
// (tensorhub_fetch_manifest_bytes_total), which those sources count as served:
// what a check of served bytes against tensor bytes leaves out.
inline uint64_t ManifestBytesRead(Client& c) {
  const std::string text = ClientFactory::MetricsText(c);
  const std::string key = "\ntensorhub_fetch_manifest_bytes_total ";
  const size_t at = text.find(key);
  return at == std::string::npos
             ? 0
             : static_cast<uint64_t>(
                   std::strtod(text.c_str() + at + key.size(), nullptr));
}

struct CountedClient {
  std::unique_ptr<Client> client;
  std::shared_ptr<transport::Server*> server;
  // Bytes this client's data server has sent (0 before it listens).
  uint64_t served() const {
    return *server == nullptr ? 0 : (*server)->bytes_served();
  }
  // Bytes of manifests this client read from sources (ManifestBytesRead).
  uint64_t manifest_bytes_read() const { return ManifestBytesRead(*client); }
};

// Client::Connect with the default dependencies, the transport wrapped.
inline Result<CountedClient> ConnectCounted(const ClientOptions& options) {
  TH_ASSIGN_OR_RETURN(ClientDeps deps, DefaultClientDeps(options));
  auto keeping =
      std::make_unique<ServerKeepingTransport>(std::move(deps.transport));
  CountedClient c;
  c.server = keeping->server();
  deps.transport = std::move(keeping);
  TH_ASSIGN_OR_RETURN(c.client,
                      ClientFactory::Connect(options, std::move(deps)));
  return c;
}

}  // namespace tensorhub::client

#endif  // TENSORHUB_CLIENT_COUNTED_CLIENT_H_
