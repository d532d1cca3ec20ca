// Where a worker serves (its data addresses, as advertised to the hub) and
// how it dials the holders the hub names: the one place that turns the
// hub's ResolvedSource into a fetch's FetchSource.
//
// Threads: Set is called once, by Client::Impl::Start, before any thread
// that reads it runs; everything else is const and may be called from any
// thread.
#ifndef TENSORHUB_CLIENT_ADDRESSES_H_
#define TENSORHUB_CLIENT_ADDRESSES_H_

#include <atomic>
#include <string>
#include <vector>

#include "client/control_plane.h"
#include "client/fetch/fetcher.h"
#include "tensorhub/client.h"

namespace tensorhub::client {

class Addresses {
 public:
  // Reads the options' hub address, labels and advertise host (not owned;
  // must outlive this).
  explicit Addresses(const ClientOptions& options) : options_(options) {}
  Addresses(const Addresses&) = delete;
  Addresses& operator=(const Addresses&) = delete;

  // The data server listens at `tcp_address` and serves `endpoints` besides
  // TCP: advertised with the options' advertise host, dialled in the
  // endpoints' order of preference, then TCP. Resolves the hub's host
  // (may block on a name lookup).
  void Set(const std::string& tcp_address, std::vector<DataEndpoint> endpoints);

  // Its TCP data server, as advertised.
  const std::string& data_address() const { return data_address_; }
  // The other transports it serves, as advertised.
  const std::vector<DataEndpoint>& endpoints() const { return endpoints_; }

  // The hub's holders as a fetch dials them: over the first transport of
  // this worker's preference that each serves, with a hint for a holder
  // that may be out of reach (reachability.h).
  std::vector<FetchSource> ToSources(
      const std::vector<ResolvedSource>& sources) const;

  // Warns, once, when this worker starts serving (its first publish, or
  // fetch that serves) if readers on other hosts cannot reach it.
  void WarnIfUnreachable() const;

 private:
  const ClientOptions& options_;
  std::string data_address_;
  std::vector<DataEndpoint> endpoints_;
  std::vector<std::string> dial_preference_;  // transport_set.h
  bool hub_is_loopback_ = true;               // reachability.h
  mutable std::atomic<bool> reach_checked_{false};
};

}  // namespace tensorhub::client

#endif  // TENSORHUB_CLIENT_ADDRESSES_H_
