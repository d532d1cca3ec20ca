// The hub process: the state machine (hub_state.h) behind a thin gRPC
// adapter, plus a thread that expires leases. The adapter converts messages,
// checks the shared secret, takes the one lock, and calls the state machine.
#ifndef TENSORHUB_HUB_HUB_SERVICE_H_
#define TENSORHUB_HUB_HUB_SERVICE_H_

#include <memory>
#include <string>

#include "hub/hub_state.h"
#include "tensorhub/status.h"

namespace tensorhub::hub {

struct HubServerOptions {
  std::string listen_address = "127.0.0.1:7070";
  int64_t lease_ms = 5000;
  std::string secret;  // empty: none required
};

class HubServer {
 public:
  // Binds and starts serving; returns once the hub accepts calls.
  static Result<std::unique_ptr<HubServer>> Start(const HubServerOptions& options);
  virtual ~HubServer() = default;
  // The bound address (the real port when 0 was asked for).
  virtual std::string address() const = 0;
  // Blocks until Shutdown() is called from another thread or a signal
  // handler thread.
  virtual void Wait() = 0;
  // Stops accepting calls, finishes calls in flight (bounded), and returns.
  virtual void Shutdown() = 0;
};

}  // namespace tensorhub::hub

#endif  // TENSORHUB_HUB_HUB_SERVICE_H_
