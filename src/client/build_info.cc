// GetBuildInfo (include/tensorhub/version.h): what CMake configured, passed
// in as compile definitions of this file alone (src/client/CMakeLists.txt).
#include <openssl/crypto.h>

#include "tensorhub/version.h"

#ifndef TH_VERSION
#error "TH_VERSION must be defined by the build"
#endif

namespace tensorhub {

const BuildInfo& GetBuildInfo() {
  static const BuildInfo info = [] {
    BuildInfo b;
    b.version = TH_VERSION;
#if TH_BUILD_CUDA
    b.cuda = true;
    b.cuda_version = TH_BUILD_CUDA_VERSION;
#endif
#if TH_BUILD_UCX
    b.ucx = true;
    b.ucx_version = TH_BUILD_UCX_VERSION;
#endif
    b.tls = true;
    b.tls_library = OpenSSL_version(OPENSSL_VERSION);
    return b;
  }();
  return info;
}

std::string BuildInfoLine() {
  const BuildInfo& b = GetBuildInfo();
  std::string s = "tensorhub " + b.version + " (";
  s += b.cuda ? "CUDA " + b.cuda_version : "no CUDA";
  s += b.ucx ? ", UCX " + b.ucx_version : ", no UCX";
  s += b.tls ? ", TLS " + b.tls_library : ", no TLS";
  return s + ")";
}

}  // namespace tensorhub
