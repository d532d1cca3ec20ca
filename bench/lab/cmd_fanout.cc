// `tensorhub-lab bench fanout`: one trainer and N readers on the multi-host
// test bed (bench/testbed.sh), each in its own network namespace behind a
// shaped link. Times how long until every reader holds a new version, beside
// the bandwidth lower bound S/B, and counts what crossed the trainer's link and
// the wide-area link. `--mode p2p` is the plain point-to-point baseline:
// readers do not serve, so every one pulls from the trainer.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "bench_testbed.h"
#include "cli_util.h"
#include "client/fetch/fetcher.h"
#include "common/log.h"
#include "demo_model.h"
#include "subprocess.h"

namespace tensorhub::cli {
namespace {

constexpr char kModel[] = "bench-fanout";

std::vector<TensorSpec> BenchLayout(uint64_t bytes) {
  // Like a model: many tiny tensors (norms, biases) and large matrices.
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 48; ++i)
    specs.push_back({"norm." + std::to_string(i), DType::kBF16, {896}});
  uint64_t left = bytes > 48 * 1792 ? bytes - 48 * 1792 : 2;
  for (int i = 0; left >= 2; ++i) {
    uint64_t n = std::min<uint64_t>(left, 32ull << 20) / 2;
    specs.push_back({"w." + std::to_string(i), DType::kBF16, {n}});
    left -= n * 2;
  }
  return specs;
}

// The flags of the test-bed roles (bench_testbed.h spawns them).
struct RoleFlags {
  WorkerFlags worker;
  uint64_t bytes = 0;
  uint64_t chunk_bytes = 4 << 20;  // trainer
  int connections = 4;             // reader
  bool no_serve = false;           // reader
};

CLI::App* AddRole(CommandLine& cl, CLI::App* bench, const std::string& name,
                  RoleFlags* f, std::function<int()> run) {
  CLI::App* c =
      cl.Add(name, "a test-bed role of bench fanout|workload", run, bench);
  f->worker.options.connect_timeout_ms = 30000;
  AddWorkerFlags(c, &f->worker);
  c->add_option("--bytes", f->bytes)->required();
  return c;
}

int RunBenchTrainer(const RoleFlags& f) {
  SetLogPrefix("trainer");
  SyntheticModel model(BenchLayout(f.bytes));
  auto client = ConnectAndSayReady(f.worker);
  if (!client.ok()) return Fail(client.status());
  PublishOptions po;
  po.chunk_bytes = f.chunk_bytes;
  const std::string self = (*client)->id().value();
  std::string line;
  uint64_t last = 0;
  // "publish V [COPIES [TIMEOUT_MS]]": before the buffers are overwritten
  // with V, wait until COPIES other workers hold all of the previous
  // version and none is still filling (the trainer's upload obligation),
  // then unpublish it (drain).
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    uint64_t v = 0, copies = 0;
    int64_t timeout_ms = 600000;
    in >> cmd >> v >> copies >> timeout_ms;
    if (cmd != "publish") break;
    auto t0 = SteadyClock::now();
    auto since = [](SteadyClock::time_point t) {
      return std::chrono::duration<double>(SteadyClock::now() - t).count();
    };
    if (last && copies > 0) {
      Deadline deadline = Deadline::AfterMs(timeout_ms);
      Status s = Status::Ok();
      for (;;) {
        auto info = (*client)->Describe(kModel, Version(last));
        if (!info.ok()) {
          s = info.status();
          break;
        }
        uint64_t full = 0, filling = 0;
        for (const HolderInfo& h : info->holders) {
          if (h.worker.value() == self) continue;
          full += !h.filling && h.chunks == info->num_chunks;
          filling += h.filling;
        }
        // A filling holder does not count as a copy, and none may be left:
        // the complete copies are readers that drop this version when they
        // fetch the next one, so a reader still filling (a joiner that
        // resolved this version late) could be left with no source at all.
        if (full >= copies && filling == 0) break;
        if (deadline.expired()) {
          s = DeadlineExceeded(
              std::to_string(full) + " of " + std::to_string(copies) +
              " copies of version " + std::to_string(last) + ", " +
              std::to_string(filling) + " holders still filling");
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      if (!s.ok()) {
        Reply("error " + s.ToString());
        continue;
      }
    }
    double wait_s = since(t0);
    auto t1 = SteadyClock::now();
    if (last) {
      Status s = (*client)->Unpublish(kModel, Version(last), 120000);
      if (!s.ok()) {
        Reply("error " + s.ToString());
        continue;
      }
    }
    double unpublish_s = since(t1);
    auto t2 = SteadyClock::now();
    model.Fill(v);
    double fill_s = since(t2);
    auto t3 = SteadyClock::now();
    Status s = (*client)->Publish(kModel, Version(v), model.tensors(), po);
    if (!s.ok()) {
      Reply("error " + s.ToString());
      continue;
    }
    last = v;
    Reply("published " + std::to_string(v) + " " + Hex(model.Digest()) + " " +
          std::to_string(wait_s) + " " + std::to_string(unpublish_s) + " " +
          std::to_string(fill_s) + " " + std::to_string(since(t3)));
  }
  return 0;
}

int RunBenchReader(const RoleFlags& f) {
  SetLogPrefix(f.worker.options.name.c_str());
  SyntheticModel model(BenchLayout(f.bytes));
  auto client = ConnectAndSayReady(f.worker);
  if (!client.ok()) return Fail(client.status());
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    uint64_t v = 0;
    in >> cmd >> v;
    if (cmd != "fetch") break;
    FetchOptions fo;
    fo.timeout_ms = 600000;
    fo.serve = !f.no_serve;
    fo.connections = f.connections;
    auto st = (*client)->Fetch(kModel, Version(v), model.tensors(), fo);
    if (!st.ok()) {
      Reply("error " + st.status().ToString());
      continue;
    }
    // bench fanout --transport ucx: every byte must have come over UCX.
    const char* want = std::getenv("TENSORHUB_TRANSPORTS");
    std::string other;
    for (const FetchSourceStats& s : st->sources) {
      if (want != nullptr && std::string(want) == "ucx" &&
          s.transport != "ucx") {
        other = s.transport;
      }
    }
    if (!other.empty()) {
      Reply("error a source was read over " + other + ", not ucx");
      continue;
    }
    std::string out = "fetched " + std::to_string(v) + " " +
                      Hex(model.Digest()) + " " + std::to_string(st->seconds) +
                      " " + std::to_string(st->chunk_retries);
    for (const FetchSourceStats& s : st->sources) {
      out += " " + s.worker.value() + ":" + std::to_string(s.bytes) + ":" +
             (s.was_filling ? "f" : "c");
    }
    Reply(out);
  }
  return 0;
}

struct FanoutFlags {
  std::string testbed = "th";
  std::optional<uint64_t> readers;
  uint64_t bytes = 0;
  std::string mode = "tensorhub";
  std::string transport = "tcp";
  uint64_t repeat = 2;
  uint64_t chunk = 0;
  int connections = 4;
  std::string port = "7070";
  int metrics_port = 0;
  // The test bed's DCs stand for racks of one datacenter, their uplinks
  // for rack uplinks; the hub is told this oversubscription (0: not told).
  bool racks = false;
  double rack_oversubscription = 0;
};

int RunBenchFanout(const FanoutFlags& f) {
  auto tb = LoadTestbed(f.testbed);
  if (!tb.ok()) return Fail(tb.status());
  tb->dcs_are_racks = f.racks;
  tb->rack_oversubscription = f.racks ? f.rack_oversubscription : 0;
  const uint64_t readers = f.readers.value_or(tb->names.size() - 1);
  const std::string& mode = f.mode;
  if (readers < 1 || readers + 1 > tb->names.size()) {
    return UsageError("the test bed has " + std::to_string(tb->names.size()) +
                      " hosts: at most " +
                      std::to_string(tb->names.size() - 1) + " --readers");
  }
  SetLogLevel(LogLevel::kWarn);
  // The roles inherit it: with ucx, every worker also serves UCX and reads
  // over it (each reader checks that every source's bytes came over it).
  ::setenv("TENSORHUB_TRANSPORTS", f.transport.c_str(), 1);
  // The test bed's UCX is tcp (no RDMA): wires no hardware checks,
  // which a worker uses only when told (docs/security.md). The caller's
  // TENSORHUB_UCX_EMULATED_GETS=refuse wins.
  if (f.transport != "tcp") {
    ::setenv("TENSORHUB_UCX_EMULATED_GETS", "allow", 0);
  }
  std::string hub;
  auto hub_proc = SpawnHub(*tb, f.port, &hub, f.metrics_port);
  if (!hub_proc.ok()) return Fail(hub_proc.status());
  std::string trainer_id;
  auto trainer =
      SpawnTrainer(*tb, hub, f.bytes, f.chunk, &trainer_id, f.metrics_port);
  if (!trainer.ok()) return Fail(trainer.status());
  std::vector<Subprocess> rs;
  for (uint64_t i = 1; i <= readers; ++i) {
    auto r = SpawnReader(*tb, i, hub, "reader-" + std::to_string(i), f.bytes,
                         mode != "p2p", f.connections, f.metrics_port);
    if (!r.ok()) return Fail(r.status());
    rs.push_back(std::move(r).value());
  }
  for (Subprocess& r : rs) {
    auto id = WaitReady(r, 60000);
    if (!id.ok()) return Fail(id.status());
  }
  // The lower bound: every reader must download S through its own link.
  const double link_bytes_per_s = tb->host_mbit * 1e6 / 8;
  std::set<std::string> remote_dcs;
  for (uint64_t i = 1; i <= readers; ++i) {
    if (tb->dcs[i] != tb->dcs[0]) remote_dcs.insert(tb->dcs[i]);
  }
  // Racks: every other rack takes the version in through its uplink once.
  const double bound = f.racks && !remote_dcs.empty()
                           ? std::max(f.bytes / link_bytes_per_s,
                                      f.bytes / (tb->wan_mbit * 1e6 / 8))
                           : f.bytes / link_bytes_per_s;
  std::printf(
      "fanout: mode %s over %s, %llu readers, %s, links %.0f Mbit/s%s, chunks "
      "of %s, bound S/B %.2f s\n",
      mode.c_str(), f.transport.c_str(),
      static_cast<unsigned long long>(readers), FormatBytes(f.bytes).c_str(),
      tb->host_mbit,
      remote_dcs.empty() ? ""
      : f.racks
          ? (", " + std::to_string(tb->num_dcs) + " racks, uplinks " +
             std::to_string(static_cast<int>(tb->wan_mbit)) +
             " Mbit/s, hub told " + std::to_string(f.rack_oversubscription) +
             ":1")
                .c_str()
          : (", WAN " + std::to_string(static_cast<int>(tb->wan_mbit)) +
             " Mbit/s, " + std::to_string(remote_dcs.size()) + " remote DC(s)")
                .c_str(),
      FormatBytes(f.chunk).c_str(), bound);
  double best = 1e30;
  bool all_ok = true;
  double best_trainer_copies = 0, best_wan = 0, best_filling = 0;
  for (uint64_t r = 1; r <= f.repeat; ++r) {
    Status s = trainer->Send("publish " + std::to_string(r));
    auto pub = s.ok() ? trainer->ReadLine(Deadline::AfterMs(600000))
                      : Result<std::string>(s);
    if (!pub.ok()) return Fail(pub.status());
    auto published = ParsePublished(*pub);
    if (!published.ok()) return Fail(published.status());
    const std::string digest = published->digest;
    uint64_t wan0 = WanTxBytes(*tb, tb->dcs[0]);
    auto t0 = SteadyClock::now();
    for (Subprocess& rd : rs) (void)rd.Send("fetch " + std::to_string(r));
    double last = 0, first = 1e30;
    uint64_t from_trainer = 0, from_filling = 0, retries = 0;
    size_t matched = 0;
    for (size_t i = 0; i < rs.size(); ++i) {
      auto line = rs[i].ReadLine(Deadline::AfterMs(900000));
      double at =
          std::chrono::duration<double>(SteadyClock::now() - t0).count();
      if (!line.ok() || line->rfind("fetched", 0) != 0) {
        std::printf(
            "  reader-%zu FAILED: %s\n", i + 1,
            line.ok() ? line->c_str() : line.status().ToString().c_str());
        all_ok = false;
        continue;
      }
      auto fetched = ParseFetched(*line);
      if (!fetched.ok()) return Fail(fetched.status());
      retries += fetched->retries;
      matched += fetched->digest == digest;
      from_trainer += fetched->BytesFrom(trainer_id);
      from_filling += fetched->BytesFromFilling();
      last = std::max(last, at);
      first = std::min(first, at);
    }
    uint64_t wan = WanTxBytes(*tb, tb->dcs[0]) - wan0;
    all_ok = all_ok && matched == rs.size();
    double copies = static_cast<double>(from_trainer) / f.bytes;
    std::printf(
        "  round %llu: all %zu readers hold it after %.2f s (first %.2f s) = "
        "%.2f x S/B; "
        "bytes match %zu/%zu; from trainer %.2f S; from filling peers %.2f S; "
        "retries %llu",
        static_cast<unsigned long long>(r), rs.size(), last, first,
        last / bound, matched, rs.size(), copies,
        static_cast<double>(from_filling) / f.bytes,
        static_cast<unsigned long long>(retries));
    if (!remote_dcs.empty())
      std::printf("; WAN out of %s %.3f S", tb->dcs[0].c_str(),
                  static_cast<double>(wan) / f.bytes);
    std::printf("\n");
    std::fflush(stdout);
    if (last < best) {
      best = last;
      best_trainer_copies = copies;
      best_wan = static_cast<double>(wan) / f.bytes;
      best_filling = static_cast<double>(from_filling) / f.bytes;
    }
  }
  (void)trainer->Send("quit");
  for (Subprocess& rd : rs) (void)rd.Send("quit");
  for (Subprocess& rd : rs) rd.Stop(3000);
  trainer->Stop(3000);
  hub_proc->Stop(3000);
  std::printf(
      "fanout mode=%s readers=%llu bytes=%llu seconds=%.3f bound_seconds=%.3f "
      "ratio=%.3f "
      "trainer_copies=%.2f from_filling_per_S=%.2f wan_per_S=%.3f ok=%d "
      "transport=%s chunk=%llu cut_through=%llu%s\n",
      mode.c_str(), static_cast<unsigned long long>(readers),
      static_cast<unsigned long long>(f.bytes), best, bound, best / bound,
      best_trainer_copies, best_filling, best_wan, all_ok ? 1 : 0,
      f.transport.c_str(), static_cast<unsigned long long>(f.chunk),
      static_cast<unsigned long long>(client::kDefaultCutThroughBytes),
      f.racks ? (" racks=" + std::to_string(tb->num_dcs) + " rack_mbit=" +
                 std::to_string(static_cast<int>(tb->wan_mbit)) +
                 " hub_oversub=" + std::to_string(f.rack_oversubscription))
                    .c_str()
              : "");
  return all_ok ? 0 : 1;
}

}  // namespace

void AddBenchFanoutCommands(CommandLine& cl, CLI::App* bench) {
  auto f = std::make_shared<FanoutFlags>();
  CLI::App* c = cl.Add(
      "fanout",
      "one trainer and N readers on bench/testbed.sh's hosts: "
      "time to S/B, trainer and WAN bytes",
      [f] { return RunBenchFanout(*f); }, bench);
  c->add_option("--testbed", f->testbed, "the test bed's prefix")
      ->capture_default_str();
  c->add_option("--readers", f->readers,
                "readers, one per host after h0 (default: every host)")
      ->check(CLI::PositiveNumber);
  AddBytesOption(c, "--bytes", &f->bytes, "256MiB", "the version's size");
  AddBytesOption(c, "--chunk-bytes", &f->chunk, "2MiB", "the chunk size");
  c->add_option("--mode", f->mode,
                "tensorhub, or p2p: readers do not serve (the baseline)")
      ->check(CLI::IsMember({"tensorhub", "p2p"}))
      ->capture_default_str();
  c->add_option("--transport", f->transport,
                "the data plane the workers read over: tcp, or ucx (UCX "
                "between the test bed's hosts; TCP stays served beside it)")
      ->check(CLI::IsMember({"tcp", "ucx"}))
      ->capture_default_str();
  c->add_option("--repeat", f->repeat, "rounds (the best is reported)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{20}))
      ->capture_default_str();
  c->add_option("--connections", f->connections, "streams per reader")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  c->add_option("--port", f->port, "the hub's port on h0")
      ->capture_default_str();
  c->add_flag("--racks", f->racks,
              "the test bed's DCs are racks of one datacenter (their shaped "
              "uplinks rack uplinks): workers get --rack labels");
  c->add_option("--rack-oversubscription", f->rack_oversubscription,
                "with --racks: tell the hub this rack uplink ratio (serve "
                "--rack-oversubscription; 0: not told)")
      ->check(CLI::Range(0.0, 1e6));
  c->add_option("--metrics-port", f->metrics_port,
                "every role serves Prometheus metrics on its host's address: "
                "workers at this port, the hub at the next (for "
                "bench/scrape_load.sh; default: none)")
      ->check(CLI::Range(1, 65534));

  auto t = std::make_shared<RoleFlags>();
  c = AddRole(cl, bench, "_trainer", t.get(),
              [t] { return RunBenchTrainer(*t); });
  c->add_option("--chunk-bytes", t->chunk_bytes);
  auto r = std::make_shared<RoleFlags>();
  c = AddRole(cl, bench, "_reader", r.get(),
              [r] { return RunBenchReader(*r); });
  c->add_option("--connections", r->connections)->check(CLI::Range(1, 64));
  c->add_flag("--no-serve", r->no_serve);
}

}  // namespace tensorhub::cli
