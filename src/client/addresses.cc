#include "client/addresses.h"

#include <utility>

#include "client/reachability.h"
#include "client/transport_set.h"
#include "common/log.h"

namespace tensorhub::client {

void Addresses::Set(const std::string& tcp_address,
                    std::vector<DataEndpoint> endpoints) {
  data_address_ = tcp_address;
  endpoints_ = std::move(endpoints);
  if (!options_.data_advertise_host.empty()) {
    auto advertised = [this](const std::string& address) {
      return options_.data_advertise_host + address.substr(address.rfind(':'));
    };
    data_address_ = advertised(data_address_);
    for (DataEndpoint& e : endpoints_) e.address = advertised(e.address);
  }
  // What this worker dials first: the transports it serves besides TCP, in
  // their order of preference (transport_set.h), then TCP.
  dial_preference_.clear();
  for (const DataEndpoint& e : endpoints_) {
    dial_preference_.push_back(e.transport);
  }
  dial_preference_.emplace_back("tcp");
  hub_is_loopback_ = HostIsLoopback(HostOf(options_.hub_address));
}

std::vector<FetchSource> Addresses::ToSources(
    const std::vector<ResolvedSource>& sources) const {
  std::vector<FetchSource> out;
  for (const ResolvedSource& s : sources) {
    const std::string dial =
        DialAddress(dial_preference_, s.data_address, s.endpoints);
    out.push_back(
        {s.worker.value(), dial, s.epoch, s.chunks, s.filling,
         LoopbackHolderHint(s.worker.value(), s.data_address, s.labels.host,
                            options_.labels.host, data_address_,
                            options_.hub_address, hub_is_loopback_),
         s.slices, dial == s.data_address ? "" : s.data_address});
  }
  return out;
}

void Addresses::WarnIfUnreachable() const {
  if (reach_checked_.exchange(true)) return;
  const std::string warning = LoopbackDataPlaneWarning(
      options_.hub_address, hub_is_loopback_, data_address_);
  if (!warning.empty()) TH_LOG(WARN) << warning;
}

}  // namespace tensorhub::client
