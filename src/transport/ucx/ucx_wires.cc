#include "transport/ucx/ucx_wires.h"

#include <algorithm>
#include <cstdlib>

namespace tensorhub::transport::ucx {

std::vector<Wire> ParseContextWires(std::string_view info) {
  std::vector<Wire> out;
  while (!info.empty()) {
    const size_t eol = std::min(info.find('\n'), info.size());
    std::string_view line = info.substr(0, eol);
    info.remove_prefix(std::min(eol + 1, info.size()));
    if (line.find("resource") == std::string_view::npos) continue;
    const size_t flags = line.find(" flags ");
    if (flags == std::string_view::npos) continue;
    // "flags XY tl/dev": two flag characters, a space, the resource.
    std::string_view rest = line.substr(flags + 7);
    if (rest.size() < 4 || rest[2] != ' ') continue;
    const bool aux = rest[0] == 'a';
    rest.remove_prefix(3);
    while (!rest.empty() && (rest.back() == ' ' || rest.back() == '\r')) {
      rest.remove_suffix(1);
    }
    const size_t slash = rest.find('/');
    if (slash == std::string_view::npos || slash == 0) continue;
    out.push_back(Wire{std::string(rest.substr(0, slash)),
                       std::string(rest.substr(slash + 1)), aux});
  }
  return out;
}

bool GetsCheckedByHardware(const Wire& w) {
  if (w.aux) return true;
  return w.transport == "rc_verbs" || w.transport == "rc_mlx5" ||
         w.transport == "dc_mlx5" || w.transport == "self";
}

std::vector<std::string> UncheckedGetWires(const std::vector<Wire>& wires) {
  std::vector<std::string> out;
  for (const Wire& w : wires) {
    if (!GetsCheckedByHardware(w)) out.push_back(w.transport + "/" + w.device);
  }
  return out;
}

Status EmulatedGetsRefusal(const std::vector<std::string>& unchecked) {
  std::string found;
  for (const std::string& w : unchecked) {
    found += (found.empty() ? "" : ", ") + w;
  }
  if (found.empty()) found = "none usable";
  return FailedPrecondition(
      std::string("ucx refused: UCX here has no RDMA wire (rc, dc), only "
                  "wires on which no hardware checks a peer's access (") +
      found +
      "): over tcp UCX writes a put request's bytes wherever it names, so a "
      "peer that proved the secret and modifies its UCX could write into "
      "this process's memory (docs/security.md, \"What a UCX peer can "
      "reach\"). "
      "Use UCX where there is RDMA (UCX_TLS=rc or dc), read over tcp "
      "(TENSORHUB_TRANSPORTS=ucx,tcp falls back to it), or, where every "
      "host of the network is trusted, allow them: " +
      std::string(kEmulatedGetsEnv) +
      "=allow (ClientOptions::ucx_emulated_gets)");
}

Result<bool> EmulatedGetsAllowedByEnv() {
  const char* v = std::getenv(kEmulatedGetsEnv);
  const std::string value = v != nullptr ? v : "";
  if (value.empty() || value == "refuse") return false;
  if (value == "allow") return true;
  return InvalidArgument(std::string(kEmulatedGetsEnv) + "='" + value +
                         "': say 'allow' (use UCX's wires on which no "
                         "hardware checks a peer) or 'refuse' (the "
                         "default)");
}

}  // namespace tensorhub::transport::ucx
