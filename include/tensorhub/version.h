// Which TensorHub this is: its version and what the build can do.
#ifndef TENSORHUB_VERSION_H_
#define TENSORHUB_VERSION_H_

#include <string>

namespace tensorhub {

struct BuildInfo {
  std::string version;  // "0.1.0", the CMake project's version
  // Device memory (CUDA staging, CUDA IPC, device checksums). A CUDA build
  // runs on machines without a GPU too, moving host memory only.
  bool cuda = false;
  std::string cuda_version;  // the toolkit it was built with, "13.0"; or ""
  // The UCX data plane (ClientOptions::transports).
  bool ucx = false;
  std::string ucx_version;  // "1.13.1" (the library loaded); or ""
  // TLS for the hub and the data plane: always built; the library it uses
  // at run time, "OpenSSL 3.0.11 19 Sep 2023".
  bool tls = true;
  std::string tls_library;
};

// Safe from any thread.
const BuildInfo& GetBuildInfo();
// One line: "tensorhub 0.1.0 (CUDA 13.0, UCX 1.13.1, TLS OpenSSL 3.0.11 ...)",
// a feature the build lacks written "no CUDA".
std::string BuildInfoLine();

}  // namespace tensorhub

#endif  // TENSORHUB_VERSION_H_
