// `tensorhub retain`, `tensorhub unretain` and `tensorhub keeper`.
#include <cstdio>

#include "cli_util.h"
#include "client/keeper.h"
#include "common/log.h"

namespace tensorhub::cli {

int CmdRetain(int argc, char** argv) {
  const bool retain = std::string(argv[1]) == "retain";
  auto args = ParseArgs(argc, argv, 2,
                        WithTlsFlags({"hub", "secret-file", "timeout-ms"}), {});
  if (!args.ok()) return Fail(args.status());
  if (args->positional.size() != 1) {
    return Fail(InvalidArgument(std::string("usage: tensorhub ") + argv[1] +
                                " MODEL@VERSION"));
  }
  auto ref = ParseModelRef(args->positional[0]);
  if (!ref.ok()) return Fail(ref.status());
  if (ref->version.is_latest()) {
    return Fail(InvalidArgument("name a version number: MODEL@VERSION"));
  }
  auto o = ClientOptionsFrom(*args);
  if (!o.ok()) return Fail(o.status());
  if (o->name.empty()) o->name = "tensorhub-cli";
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

int CmdKeeper(int argc, char** argv) {
  auto args = ParseArgs(
      argc, argv, 2,
      WithTlsFlags({"hub", "secret-file", "name", "datacenter", "rack",
                    "host-label", "data-listen", "advertise-host",
                    "memory-limit", "leave-timeout-ms", "metrics-listen"}),
      {kDataTlsFlag});
  if (!args.ok()) return Fail(args.status());
  if (args->Has("spot")) {
    return Fail(InvalidArgument("a keeper is a reliable worker; no --spot"));
  }
  auto o = ClientOptionsFrom(*args);
  if (!o.ok()) return Fail(o.status());
  client::KeeperOptions ko;
  ko.client = *o;
  if (args->Has("memory-limit")) {
    auto limit = ParseBytes(args->Get("memory-limit"));
    if (!limit.ok()) return Fail(limit.status());
    if (*limit == 0) return Fail(InvalidArgument("--memory-limit must be > 0"));
    ko.memory_limit_bytes = *limit;
  }
  auto leave = args->GetU64("leave-timeout-ms", 60000);
  if (!leave.ok()) return Fail(leave.status());
  if (*leave > 600000) {
    return Fail(InvalidArgument("--leave-timeout-ms must be at most 600000"));
  }
  ko.client.leave_timeout_ms = static_cast<int64_t>(*leave);
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

}  // namespace tensorhub::cli
