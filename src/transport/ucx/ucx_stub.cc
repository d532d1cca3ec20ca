// The UCX transport in a build without UCX (TH_UCX=OFF): everything that
// would pick it falls back to TCP.
#include "transport/ucx/ucx_transport.h"

namespace tensorhub::transport {

bool UcxAvailable() { return false; }

Result<std::unique_ptr<Transport>> MakeUcxTransport(
    const UcxTransportOptions&) {
  return Unavailable(
      "this build has no UCX transport (configure with -DTH_UCX=ON and "
      "libucx-dev installed)");
}

uint64_t UcxContextFeaturesForTest() { return 0; }

std::string InterfaceOf(const std::string&) { return ""; }

}  // namespace tensorhub::transport
