// `tensorhub ls` and `tensorhub show`.
#include <cstdio>

#include "cli_util.h"

namespace tensorhub::cli {
namespace {

// ls, show: a hub address, a secret and a deadline; no data plane.
struct QueryFlags {
  WorkerFlags worker;
  uint64_t timeout_ms = 10000;
  std::string ref;  // show
};

void AddQueryFlags(CLI::App* c, QueryFlags* f) {
  AddHubFlags(c, &f->worker);
  c->add_option("--timeout-ms", f->timeout_ms, "deadline for reaching the hub")
      ->check(CLI::Range(uint64_t{1}, uint64_t{3600000}))
      ->capture_default_str();
}

Result<std::unique_ptr<Client>> ConnectQuiet(const QueryFlags& f) {
  TH_ASSIGN_OR_RETURN(ClientOptions o, ClientOptionsFrom(f.worker));
  if (o.name.empty()) o.name = "tensorhub-cli";
  o.connect_timeout_ms = static_cast<int64_t>(f.timeout_ms);
  return Client::Connect(o);
}

int RunLs(const QueryFlags& f) {
  auto client = ConnectQuiet(f);
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

int RunShow(const QueryFlags& f) {
  auto ref = ParseModelRef(f.ref);
  if (!ref.ok()) return Fail(ref.status());
  auto client = ConnectQuiet(f);
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

}  // namespace

void AddInspectCommands(CommandLine& cl) {
  auto ls = std::make_shared<QueryFlags>();
  AddQueryFlags(cl.Add("ls", "models and versions: state, ranks, holders, size",
                       [ls] { return RunLs(*ls); }),
                ls.get());
  auto show = std::make_shared<QueryFlags>();
  CLI::App* c = cl.Add("show", "a version's tensors, chunks and holders",
                       [show] { return RunShow(*show); });
  c->add_option("version", show->ref, "the version to describe")
      ->type_name("MODEL[@VERSION|@latest]")
      ->required();
  AddQueryFlags(c, show.get());
}

}  // namespace tensorhub::cli
