#include "client/reachability.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include <cstring>

namespace tensorhub::client {
namespace {

constexpr char kFix[] =
    "--data-listen 0.0.0.0:PORT --advertise-host HOST (HOST: an address of "
    "this machine the other hosts can reach; ClientOptions::"
    "data_listen_address and data_advertise_host)";

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

std::string HostOf(std::string_view address) {
  if (!address.empty() && address.front() == '[') {
    const size_t close = address.find(']');
    if (close != std::string_view::npos) {
      return std::string(address.substr(1, close - 1));
    }
  }
  const size_t colon = address.rfind(':');
  // More than one colon and no brackets: a bare IPv6 address, no port.
  if (colon == std::string_view::npos || address.find(':') != colon) {
    return std::string(address);
  }
  return std::string(address.substr(0, colon));
}

bool IsLoopbackHost(std::string_view host) {
  if (host == "localhost" || EndsWith(host, ".localhost")) return true;
  const std::string h(host);
  in_addr v4{};
  if (::inet_pton(AF_INET, h.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6{};
  if (::inet_pton(AF_INET6, h.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

bool IsUnspecifiedHost(std::string_view host) {
  const std::string h(host);
  in_addr v4{};
  if (::inet_pton(AF_INET, h.c_str(), &v4) == 1) return v4.s_addr == 0;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, h.c_str(), &v6) == 1) {
    return IN6_IS_ADDR_UNSPECIFIED(&v6);
  }
  return false;
}

bool IsLocalOnlyHost(std::string_view host) {
  return IsLoopbackHost(host) || IsUnspecifiedHost(host);
}

bool HostIsLoopback(const std::string& host) {
  if (IsLoopbackHost(host)) return true;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return true;
  bool all_loopback = true;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {0};
    const void* a = nullptr;
    if (ai->ai_family == AF_INET) {
      a = &reinterpret_cast<const sockaddr_in*>(ai->ai_addr)->sin_addr;
    } else if (ai->ai_family == AF_INET6) {
      a = &reinterpret_cast<const sockaddr_in6*>(ai->ai_addr)->sin6_addr;
    }
    if (a == nullptr ||
        ::inet_ntop(ai->ai_family, a, buf, sizeof(buf)) == nullptr ||
        !IsLoopbackHost(buf)) {
      all_loopback = false;
    }
  }
  ::freeaddrinfo(res);
  return all_loopback;
}

std::string LoopbackDataPlaneWarning(std::string_view hub_address,
                                     bool hub_is_loopback,
                                     std::string_view data_address) {
  const std::string host = HostOf(data_address);
  if (hub_is_loopback || !IsLocalOnlyHost(host)) return "";
  const std::string what = IsUnspecifiedHost(host)
                               ? "an address to listen on, not one to dial"
                               : "a loopback address";
  return "this worker's data plane advertises " + std::string(data_address) +
         ", " + what + ", but its hub is at " + std::string(hub_address) +
         ": readers on other hosts cannot reach it (their reads from it "
         "fail). Start it with " +
         kFix;
}

std::string LoopbackHolderHint(std::string_view worker,
                               std::string_view holder_address,
                               std::string_view holder_host_label,
                               std::string_view reader_host_label,
                               std::string_view reader_data_address,
                               std::string_view hub_address,
                               bool hub_is_loopback) {
  if (!IsLocalOnlyHost(HostOf(holder_address))) return "";
  std::string reach;
  if (!holder_host_label.empty() && !reader_host_label.empty()) {
    if (holder_host_label == reader_host_label) return "";
    reach = "it cannot be reached from this host (its host label is '" +
            std::string(holder_host_label) + "', this reader's '" +
            std::string(reader_host_label) + "')";
  } else if (!IsLocalOnlyHost(HostOf(reader_data_address))) {
    reach = "it cannot be reached from this host (this reader advertises " +
            std::string(reader_data_address) + ")";
  } else if (!hub_is_loopback) {
    reach = "it cannot be reached from another host, and with the hub at " +
            std::string(hub_address) + " the workers may well span hosts";
  } else {
    return "";
  }
  const char* kind = IsUnspecifiedHost(HostOf(holder_address))
                         ? ", an address to listen on, not to dial: "
                         : ", which is loopback: ";
  return "holder " + std::string(worker) + " advertises " +
         std::string(holder_address) + kind + reach + "; start it with " + kFix;
}

}  // namespace tensorhub::client
