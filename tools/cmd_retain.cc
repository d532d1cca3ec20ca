// `tensorhub retain`, `tensorhub unretain` and `tensorhub keeper`.
#include <cstdio>

#include "cli_util.h"
#include "client/keeper.h"
#include "common/log.h"

namespace tensorhub::cli {
namespace {

struct RetainFlags {
  WorkerFlags worker;
  std::string ref;
  uint64_t timeout_ms = 10000;
};

int RunRetain(const RetainFlags& f, bool retain) {
  auto ref = ParseModelRef(f.ref);
  if (!ref.ok()) return Fail(ref.status());
  if (ref->version.is_latest()) {
    return Fail(InvalidArgument("name a version number: MODEL@VERSION"));
  }
  auto o = ClientOptionsFrom(f.worker);
  if (!o.ok()) return Fail(o.status());
  if (o->name.empty()) o->name = "tensorhub-cli";
  o->connect_timeout_ms = static_cast<int64_t>(f.timeout_ms);
  auto client = Client::Connect(*o);
  if (!client.ok()) return Fail(client.status());
  Status s = retain ? (*client)->Retain(ref->model, ref->version)
                    : (*client)->Unretain(ref->model, ref->version);
  if (!s.ok()) return Fail(s);
  std::printf("%s %s@%llu\n", retain ? "retained" : "unretained",
              ref->model.c_str(),
              static_cast<unsigned long long>(ref->version.value()));
  return 0;
}

struct KeeperFlags {
  WorkerFlags worker;
  uint64_t memory_limit_bytes = 0;  // 0: the keeper's default
  uint64_t leave_timeout_ms = 60000;
};

int RunKeeper(const KeeperFlags& f) {
  if (f.worker.options.worker_class == WorkerClass::kSpot) {
    return UsageError("a keeper is a reliable worker; no --spot");
  }
  auto o = ClientOptionsFrom(f.worker);
  if (!o.ok()) return Fail(o.status());
  client::KeeperOptions ko;
  ko.client = *o;
  if (f.memory_limit_bytes > 0) ko.memory_limit_bytes = f.memory_limit_bytes;
  ko.client.leave_timeout_ms = static_cast<int64_t>(f.leave_timeout_ms);
  BlockStopSignals();
  SetLogPrefix("keeper");
  auto keeper = client::Keeper::Start(ko);
  if (!keeper.ok()) return Fail(keeper.status());
  std::printf("keeper %s serving at %s, memory limit %s\n",
              (*keeper)->id().value().c_str(), o->hub_address.c_str(),
              FormatBytes((*keeper)->memory_limit_bytes()).c_str());
  std::fflush(stdout);
  int sig = WaitForStopSignal();
  client::KeeperStats st = (*keeper)->stats();
  TH_LOG(INFO) << "signal " << sig << ": stopping; holding " << st.versions_held
               << " version(s), " << st.bytes_held << " bytes; copied "
               << st.fetched << ", released " << st.released << ", refused "
               << st.refused;
  // Leaving waits (--leave-timeout-ms) for another keeper to copy what
  // only we hold.
  keeper->reset();
  return 0;
}

}  // namespace

void AddRetainCommands(CommandLine& cl) {
  for (const bool retain : {true, false}) {
    auto f = std::make_shared<RetainFlags>();
    CLI::App* c = cl.Add(
        retain ? "retain" : "unretain",
        retain ? "pin a version: keepers copy it before its last holder goes"
               : "withdraw a retain pin",
        [f, retain] { return RunRetain(*f, retain); });
    c->add_option("version", f->ref, "the version")
        ->type_name("MODEL@VERSION")
        ->required();
    AddHubFlags(c, &f->worker);
    c->add_option("--timeout-ms", f->timeout_ms,
                  "deadline for reaching the hub")
        ->check(CLI::Range(uint64_t{1}, uint64_t{3600000}))
        ->capture_default_str();
  }

  auto k = std::make_shared<KeeperFlags>();
  CLI::App* c = cl.Add("keeper",
                       "hold retained versions in host memory, until "
                       "interrupted",
                       [k] { return RunKeeper(*k); });
  AddBytesOption(c, "--memory-limit", &k->memory_limit_bytes, "0",
                 "host memory for the copies it holds (0: half of physical "
                 "memory)");
  c->add_option("--leave-timeout-ms", k->leave_timeout_ms,
                "on exit, wait this long for another keeper to copy what "
                "only this one holds")
      ->check(CLI::Range(uint64_t{0}, uint64_t{600000}))
      ->capture_default_str();
  AddWorkerFlags(c, &k->worker);
}

}  // namespace tensorhub::cli
