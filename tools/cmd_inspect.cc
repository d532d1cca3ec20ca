// `tensorhub ls` and `tensorhub show`: read-only questions to the hub. They
// ask through a HubWatcher, which registers no worker (no lease, no data
// server, nothing in the hub's tables), and print a table, or with --json
// one JSON document on stdout for scripts.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli_util.h"

namespace tensorhub::cli {
namespace {

using Json = nlohmann::ordered_json;

// ls, show: a hub address, a secret and a deadline; no data plane.
struct QueryFlags {
  WorkerFlags worker;
  uint64_t timeout_ms = 10000;
  bool json = false;
  std::string ref;  // show
};

void AddQueryFlags(CLI::App* c, QueryFlags* f) {
  AddHubFlags(c, &f->worker);
  c->add_option("--timeout-ms", f->timeout_ms, "deadline for reaching the hub")
      ->check(CLI::Range(uint64_t{1}, uint64_t{3600000}))
      ->capture_default_str();
  c->add_flag("--json", f->json,
              "print one JSON document (sizes in bytes) instead of a table");
}

Result<std::unique_ptr<HubWatcher>> Watch(const QueryFlags& f) {
  TH_ASSIGN_OR_RETURN(ClientOptions o, ClientOptionsFrom(f.worker));
  o.rpc_timeout_ms = static_cast<int64_t>(f.timeout_ms);
  return HubWatcher::Connect(o);
}

void PrintJson(const Json& j) { std::printf("%s\n", j.dump(2).c_str()); }

Json SummaryJson(const VersionInfo& v) {
  return Json{{"version", v.version.value()},
              {"state", std::string(VersionStateName(v.state))},
              {"parts_published", v.parts_published},
              {"group_size", v.group_size},
              {"holders", v.num_holders},
              {"bytes", v.total_bytes},
              {"retained", v.retained}};
}

int RunLs(const QueryFlags& f) {
  auto hub = Watch(f);
  if (!hub.ok()) return Fail(hub.status());
  auto models = (*hub)->List();
  if (!models.ok()) return Fail(models.status());
  if (f.json) {
    Json out = Json::array();
    for (const ModelInfo& m : *models) {
      Json versions = Json::array();
      for (const VersionInfo& v : m.versions)
        versions.push_back(SummaryJson(v));
      out.push_back(Json{{"model", m.model}, {"versions", versions}});
    }
    PrintJson(Json{{"models", out}});
    return 0;
  }
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

Json ShowJson(const VersionInfo& v) {
  Json j{{"model", v.model}};
  j.update(SummaryJson(v));
  j["chunk_bytes"] = v.chunk_bytes;
  j["chunks"] = v.num_chunks;
  Json holders = Json::array();
  for (const HolderInfo& h : v.holders) {
    holders.push_back(Json{
        {"worker", h.worker.value()},
        {"data_address", h.data_address},
        {"class", h.worker_class == WorkerClass::kSpot ? "spot" : "reliable"},
        {"datacenter", h.labels.datacenter},
        {"rack", h.labels.rack},
        {"host", h.labels.host},
        {"chunks", h.chunks},
        {"filling", h.filling}});
  }
  j["holders_listed"] = holders;
  Json tensors = Json::array();
  for (const TensorInfo& t : v.tensors) {
    tensors.push_back(Json{{"name", t.spec.name},
                           {"dtype", std::string(DTypeName(t.spec.dtype))},
                           {"shape", t.spec.shape},
                           {"bytes", t.bytes},
                           {"rank", t.rank}});
  }
  j["tensors"] = tensors;
  // Values are free-form bytes (a safetensors header, a checkpoint's
  // files): their keys and sizes only.
  Json metadata = Json::array();
  for (const auto& [k, val] : v.metadata) {
    metadata.push_back(Json{{"key", k}, {"bytes", val.size()}});
  }
  j["metadata"] = metadata;
  return j;
}

int RunShow(const QueryFlags& f) {
  auto ref = ParseModelRef(f.ref);
  if (!ref.ok()) return Fail(ref.status());
  auto hub = Watch(f);
  if (!hub.ok()) return Fail(hub.status());
  auto v = (*hub)->Describe(ref->model, ref->version);
  if (!v.ok()) return Fail(v.status());
  if (f.json) {
    PrintJson(ShowJson(*v));
    return 0;
  }
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
    std::printf("\nholders (%u, %zu listed):\n", v->num_holders,
                v->holders.size());
  } else {
    std::printf("\nholders (%zu):\n", v->holders.size());
  }
  for (const HolderInfo& h : v->holders) {
    std::printf("  %-12s %-22s %-7s dc=%s rack=%s host=%s chunks=%llu%s\n",
                h.worker.value().c_str(), h.data_address.c_str(),
                h.worker_class == WorkerClass::kSpot ? "spot" : "reliable",
                h.labels.datacenter.c_str(), h.labels.rack.c_str(),
                h.labels.host.c_str(),
                static_cast<unsigned long long>(h.chunks),
                h.filling ? " (filling)" : "");
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
  AddQueryFlags(cl.Add("ls",
                       "models and versions: state, ranks, holders, size "
                       "(registers no worker)",
                       [ls] { return RunLs(*ls); }),
                ls.get());
  auto show = std::make_shared<QueryFlags>();
  CLI::App* c = cl.Add("show",
                       "a version's tensors, chunks and holders (registers "
                       "no worker)",
                       [show] { return RunShow(*show); });
  c->add_option("version", show->ref, "the version to describe")
      ->type_name("MODEL[@VERSION|@latest]")
      ->required();
  AddQueryFlags(c, show.get());
}

}  // namespace tensorhub::cli
