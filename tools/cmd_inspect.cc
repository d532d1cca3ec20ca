// `tensorhub ls` and `tensorhub show`.
#include <cstdio>

#include "cli_util.h"

namespace tensorhub::cli {
namespace {

Result<std::unique_ptr<Client>> ConnectQuiet(const Args& args) {
  TH_ASSIGN_OR_RETURN(ClientOptions o, ClientOptionsFrom(args));
  if (o.name.empty()) o.name = "tensorhub-cli";
  return Client::Connect(o);
}

}  // namespace

int CmdLs(int argc, char** argv) {
  auto args = ParseArgs(argc, argv, 2,
                        WithTlsFlags({"hub", "secret-file", "timeout-ms"}), {});
  if (!args.ok()) return Fail(args.status());
  auto client = ConnectQuiet(*args);
  if (!client.ok()) return Fail(client.status());
  auto models = (*client)->List();
  if (!models.ok()) return Fail(models.status());
  if (models->empty()) {
    std::printf("no models\n");
    return 0;
  }
  std::printf("%-32s %10s  %-11s %7s %8s %12s  %s\n", "MODEL", "VERSION",
              "STATE", "RANKS", "HOLDERS", "BYTES", "RETAINED");
  for (const ModelInfo& m : *models) {
    for (const VersionInfo& v : m.versions) {
      char ranks[32];
      std::snprintf(ranks, sizeof(ranks), "%u/%u", v.parts_published,
                    v.group_size);
      std::printf("%-32s %10llu  %-11s %7s %8u %12s  %s\n", m.model.c_str(),
                  static_cast<unsigned long long>(v.version.value()),
                  std::string(VersionStateName(v.state)).c_str(), ranks,
                  v.num_holders, FormatBytes(v.total_bytes).c_str(),
                  v.retained ? "yes" : "-");
    }
  }
  return 0;
}

int CmdShow(int argc, char** argv) {
  auto args = ParseArgs(argc, argv, 2,
                        WithTlsFlags({"hub", "secret-file", "timeout-ms"}), {});
  if (!args.ok()) return Fail(args.status());
  if (args->positional.size() != 1) {
    return Fail(
        InvalidArgument("usage: tensorhub show MODEL[@VERSION|@latest]"));
  }
  auto ref = ParseModelRef(args->positional[0]);
  if (!ref.ok()) return Fail(ref.status());
  auto client = ConnectQuiet(*args);
  if (!client.ok()) return Fail(client.status());
  auto v = (*client)->Describe(ref->model, ref->version);
  if (!v.ok()) return Fail(v.status());
  std::printf("%s@%llu  %s%s\n", v->model.c_str(),
              static_cast<unsigned long long>(v->version.value()),
              std::string(VersionStateName(v->state)).c_str(),
              v->retained ? "  retained" : "");
  if (v->num_chunks > 0) {
    std::printf("  %s in %zu tensors, %llu chunks of %s, %u rank(s)\n",
                FormatBytes(v->total_bytes).c_str(), v->tensors.size(),
                static_cast<unsigned long long>(v->num_chunks),
                FormatBytes(v->chunk_bytes).c_str(), v->group_size);
  }
  if (v->holders.size() < v->num_holders) {
    std::printf("\nholders (%u, the nearest %zu listed):\n", v->num_holders,
                v->holders.size());
  } else {
    std::printf("\nholders (%zu):\n", v->holders.size());
  }
  for (const HolderInfo& h : v->holders) {
    std::printf("  %-12s %-22s %-7s dc=%s rack=%s host=%s chunks=%llu\n",
                h.worker.value().c_str(), h.data_address.c_str(),
                h.worker_class == WorkerClass::kSpot ? "spot" : "reliable",
                h.labels.datacenter.c_str(), h.labels.rack.c_str(),
                h.labels.host.c_str(),
                static_cast<unsigned long long>(h.chunks));
  }
  if (!v->tensors.empty()) {
    std::printf("\ntensors (%zu):\n", v->tensors.size());
    for (const TensorInfo& t : v->tensors) {
      std::string shape = "[";
      for (size_t i = 0; i < t.spec.shape.size(); ++i) {
        shape += (i ? ", " : "") + std::to_string(t.spec.shape[i]);
      }
      shape += "]";
      std::printf("  %-60s %-6s %-20s %12s rank %u\n", t.spec.name.c_str(),
                  std::string(DTypeName(t.spec.dtype)).c_str(), shape.c_str(),
                  FormatBytes(t.bytes).c_str(), t.rank);
    }
  }
  return 0;
}

}  // namespace tensorhub::cli
