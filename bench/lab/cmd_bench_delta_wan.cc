// `tensorhub-lab bench delta-wan`: a new version reaching the readers of a
// remote datacenter across a slow wide-area link, whole against as a delta
// (docs/benchmarks.md section 17; docs/design.md "Deltas on slow links"),
// on the multi-host test bed (bench/testbed.sh, 2 datacenters).
//
// The trainer (host 0, datacenter 0) makes consecutive versions with the
// workload generator (weight_steps.h: Adam on fp32 master weights at --lr,
// cast to bf16), so what changes comes from the arithmetic. Every reader
// holds version 1 (fetched unmeasured); then the trainer publishes version
// 2, keeping 1 published, and every reader fetches 2. Measured from the
// publish: until every remote reader (the last datacenter's hosts) holds
// it, until every local reader (datacenter 0's other hosts) does, and the
// bytes that left datacenter 0 on its wide-area uplink (the link's own
// counter: Ethernet, IP and TCP framing and the hub's calls included). Run
// once with deltas off (every worker: DeltaOptions::serve and read false,
// as before deltas) and once with them on, each on fresh processes, the
// same seed, so both move the same bytes. Each reader checks its copy
// against the trainer's digest. Prints both beside the bound S/W and the
// targets: wide-area bytes at most 0.1 S (at <= 2% changed elements), the
// remote readers at least 5x sooner, the local fan-out no slower.
//
// Roles (hidden commands, spawned in the test bed's namespaces):
//   bench _delta-trainer   "publish V" -> "published V DIGEST CHANGED
//   PUBLISH_S" bench _delta-reader    "fetch V"   -> "fetched V DIGEST SECONDS
//                                          FROM_DELTA DELTA_WIRE READ_WHOLE"
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "bench_testbed.h"
#include "cli_util.h"
#include "common/checksum.h"
#include "common/log.h"
#include "subprocess.h"
#include "tensorhub/host_buffer.h"
#include "weight_steps.h"

namespace tensorhub::cli {
namespace {

constexpr char kModel[] = "bench-delta";
constexpr uint64_t kTensorElements = 8ull << 20;  // bf16 tensors of 16 MiB

using SteadyClock = std::chrono::steady_clock;
double Since(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

struct RoleFlags {
  WorkerFlags worker;
  uint64_t elements = 32ull << 20;
  double lr = 1e-6;
  int warmup_steps = 3;
  uint64_t seed = 1;
  uint64_t chunk_bytes = 4ull << 20;
  int connections = 4;
};

// One version's buffer: `elements` bf16 weights cut into tensors of at most
// kTensorElements.
class Buffer {
 public:
  static Result<Buffer> Make(uint64_t elements) {
    Buffer b;
    TH_ASSIGN_OR_RETURN(b.mem_, HostBuffer::Allocate(2 * elements));
    for (uint64_t at = 0, i = 0; at < elements; at += kTensorElements, ++i) {
      const uint64_t n = std::min(kTensorElements, elements - at);
      b.refs_.push_back({{"w." + std::to_string(i), DType::kBF16, {n}},
                         b.mem_.data() + 2 * at,
                         2 * n,
                         MemoryLocation::Host()});
    }
    return b;
  }
  std::span<uint8_t> bytes() { return {mem_.data(), mem_.size()}; }
  const std::vector<TensorRef>& refs() const { return refs_; }
  uint64_t Digest() const { return Xxh3(mem_.data(), mem_.size()); }

 private:
  HostBuffer mem_;
  std::vector<TensorRef> refs_;
};

// A role's two buffers: one version and its base (--no-deltas, a worker
// flag, turns serving and reading deltas off).
Status MakeBuffers(uint64_t elements, Buffer (&bufs)[2]) {
  for (Buffer& b : bufs) {
    TH_ASSIGN_OR_RETURN(b, Buffer::Make(elements));
  }
  return Status::Ok();
}

int RunTrainer(const RoleFlags& f) {
  SetLogPrefix("trainer");
  lab::WeightStepsOptions wo;
  wo.elements = f.elements;
  wo.seed = f.seed;
  lab::WeightSteps steps(wo);
  for (int i = 0; i < f.warmup_steps; ++i) steps.Step(static_cast<float>(f.lr));
  Buffer bufs[2];
  if (Status s = MakeBuffers(f.elements, bufs); !s.ok()) return Fail(s);
  auto client = ConnectAndSayReady(f.worker);
  if (!client.ok()) return Fail(client.status());
  PublishOptions po;
  po.chunk_bytes = f.chunk_bytes;
  std::string line;
  uint64_t last = 0;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    uint64_t v = 0;
    in >> cmd >> v;
    if (cmd != "publish" || v == 0) break;
    Buffer& b = bufs[v % 2];
    // The buffer's previous version (v - 2) leaves first; v - 1 stays
    // published: the base of v's delta.
    if (v >= 3) {
      Status s = (*client)->Unpublish(kModel, Version(v - 2), 120000);
      if (!s.ok()) {
        Reply("error " + s.ToString());
        continue;
      }
    }
    if (last != 0) steps.Step(static_cast<float>(f.lr));
    steps.CastBf16(b.bytes());
    const double changed =
        last == 0 ? 1.0
                  : lab::ChangedFraction(bufs[last % 2].bytes().data(),
                                         b.bytes().data(), b.bytes().size(), 2);
    const auto t0 = SteadyClock::now();
    Status s = (*client)->Publish(kModel, Version(v), b.refs(), po);
    if (!s.ok()) {
      Reply("error " + s.ToString());
      continue;
    }
    last = v;
    Reply("published " + std::to_string(v) + " " + Hex(b.Digest()) + " " +
          std::to_string(changed) + " " + std::to_string(Since(t0)));
  }
  return 0;
}

int RunReader(const RoleFlags& f) {
  SetLogPrefix(f.worker.options.name.c_str());
  Buffer bufs[2];
  if (Status s = MakeBuffers(f.elements, bufs); !s.ok()) return Fail(s);
  auto client = ConnectAndSayReady(f.worker);
  if (!client.ok()) return Fail(client.status());
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    uint64_t v = 0;
    in >> cmd >> v;
    if (cmd != "fetch" || v == 0) break;
    FetchOptions fo;
    fo.timeout_ms = 600000;
    fo.connections = f.connections;
    // The buffer's older version stops being served first (the fetch does
    // it: ReleaseOverlapping); the other buffer, v - 1, is the base.
    Buffer& b = bufs[v % 2];
    auto st = (*client)->Fetch(kModel, Version(v), b.refs(), fo);
    if (!st.ok()) {
      Reply("error " + st.status().ToString());
      continue;
    }
    Reply("fetched " + std::to_string(v) + " " + Hex(b.Digest()) + " " +
          std::to_string(st->seconds) + " " +
          std::to_string(st->bytes_from_delta) + " " +
          std::to_string(st->delta_wire_bytes) + " " +
          std::to_string(st->delta_chunks_read_whole));
  }
  return 0;
}

struct WanFlags {
  std::string testbed = "thd";
  uint64_t elements = 32ull << 20;
  double lr = 1e-6;
  int warmup_steps = 3;
  uint64_t seed = 1;
  uint64_t chunk_bytes = 4ull << 20;
  int connections = 4;
  std::string port = "7071";
  std::string modes = "full,delta";
};

struct ModeResult {
  double remote_s = 0, local_s = 0, changed = 0;
  uint64_t wan_bytes = 0, from_delta = 0, delta_wire = 0;
  // Remote readers that read some of the version through a delta.
  int delta_readers = 0;
};

std::vector<std::string> RoleArgs(const Testbed& t, size_t host,
                                  const std::string& role,
                                  const std::string& name,
                                  const std::string& hub, const WanFlags& f,
                                  bool deltas) {
  std::vector<std::string> a = {
      "bench",          role,
      "--hub",          hub,
      "--name",         name,
      "--datacenter",   t.dcs[host],
      "--host-label",   t.names[host],
      "--data-listen",  t.ips[host] + ":0",
      "--elements",     std::to_string(f.elements),
      "--lr",           std::to_string(f.lr),
      "--warmup-steps", std::to_string(f.warmup_steps),
      "--seed",         std::to_string(f.seed),
      "--chunk-bytes",  std::to_string(f.chunk_bytes),
      "--connections",  std::to_string(f.connections)};
  if (!deltas) {
    a.push_back("--no-deltas");
  } else {
    // The links as they are on this test bed, as a user states theirs: the
    // choice between a delta and whole chunks is made on them.
    a.insert(a.end(), {"--wide-area-mbit", std::to_string(t.wan_mbit),
                       "--datacenter-mbit", std::to_string(t.host_mbit)});
  }
  return a;
}

// Sends `cmd` to every role, then reads each one's reply, in order.
Result<std::vector<std::string>> AskAll(std::vector<Subprocess*> roles,
                                        const std::string& cmd) {
  for (Subprocess* r : roles) TH_RETURN_IF_ERROR(r->Send(cmd));
  std::vector<std::string> out(roles.size());
  for (size_t i = 0; i < roles.size(); ++i) {
    TH_ASSIGN_OR_RETURN(out[i], roles[i]->ReadLine(Deadline::AfterMs(900000)));
  }
  return out;
}

Result<ModeResult> RunMode(const Testbed& t, const WanFlags& f, bool deltas) {
  std::string hub;
  TH_ASSIGN_OR_RETURN(Subprocess hub_proc, SpawnHub(t, f.port, &hub));
  TH_ASSIGN_OR_RETURN(Subprocess trainer,
                      Subprocess::Spawn(RoleArgs(t, 0, "_delta-trainer",
                                                 "trainer", hub, f, deltas),
                                        RoleEnv(), t.Exec(0)));
  TH_RETURN_IF_ERROR(WaitReady(trainer, 300000).status());
  const std::string& home = t.dcs[0];
  std::vector<Subprocess> readers;
  std::vector<bool> remote;
  for (size_t h = 1; h < t.names.size(); ++h) {
    TH_ASSIGN_OR_RETURN(
        Subprocess r, Subprocess::Spawn(RoleArgs(t, h, "_delta-reader",
                                                 "reader-" + std::to_string(h),
                                                 hub, f, deltas),
                                        RoleEnv(), t.Exec(h)));
    readers.push_back(std::move(r));
    remote.push_back(t.dcs[h] != home);
  }
  for (Subprocess& r : readers)
    TH_RETURN_IF_ERROR(WaitReady(r, 60000).status());
  std::vector<Subprocess*> all;
  for (Subprocess& r : readers) all.push_back(&r);

  ModeResult out;
  for (uint64_t v : {1, 2}) {
    const uint64_t wan0 = WanTxBytes(t, home);
    const auto t0 = SteadyClock::now();
    TH_RETURN_IF_ERROR(trainer.Send("publish " + std::to_string(v)));
    TH_ASSIGN_OR_RETURN(std::string pub,
                        trainer.ReadLine(Deadline::AfterMs(300000)));
    std::istringstream pin(pub);
    std::string word, digest;
    uint64_t pv = 0;
    double changed = 0;
    if (!(pin >> word >> pv >> digest >> changed) || word != "published") {
      return Internal("trainer: " + pub);
    }
    // Every reader starts its fetch now; each holds the version its own
    // fetch time later (replies are read in order, not as they come).
    const double sent_s = Since(t0);
    TH_ASSIGN_OR_RETURN(std::vector<std::string> replies,
                        AskAll(all, "fetch " + std::to_string(v)));
    const uint64_t wan = WanTxBytes(t, home) - wan0;
    double remote_s = 0, local_s = 0;
    uint64_t from_delta = 0, delta_wire = 0;
    int delta_readers = 0;
    for (size_t i = 0; i < replies.size(); ++i) {
      std::istringstream rin(replies[i]);
      std::string rword, rdigest;
      uint64_t rv = 0, fd = 0, dw = 0, whole = 0;
      double secs = 0;
      if (!(rin >> rword >> rv >> rdigest >> secs >> fd >> dw >> whole) ||
          rword != "fetched") {
        return Internal("reader " + std::to_string(i + 1) + ": " + replies[i]);
      }
      if (rdigest != digest) {
        return DataLoss("reader " + std::to_string(i + 1) + " holds " +
                        rdigest + ", the trainer published " + digest);
      }
      double& group = remote[i] ? remote_s : local_s;
      group = std::max(group, sent_s + secs);
      if (remote[i]) {
        from_delta += fd;
        delta_wire += dw;
        delta_readers += fd > 0 ? 1 : 0;
      }
    }
    if (v == 2) {
      out = {remote_s,   local_s,    changed,      wan,
             from_delta, delta_wire, delta_readers};
    }
  }
  for (Subprocess& r : readers) r.Stop(5000);
  trainer.Stop(5000);
  hub_proc.Stop(5000);
  return out;
}

int RunWan(const WanFlags& f) {
  auto tb = LoadTestbed(f.testbed);
  if (!tb.ok()) return Fail(tb.status());
  if (tb->num_dcs < 2 || tb->names.size() < 3) {
    return UsageError(
        "bench delta-wan needs a test bed of 2 datacenters "
        "(bench/testbed.sh up --dcs 2)");
  }
  SetLogLevel(LogLevel::kWarn);
  const uint64_t s_bytes = 2 * f.elements;
  const double w_bytes_per_s = tb->wan_mbit * 1e6 / 8;
  size_t remote = 0;
  for (size_t h = 1; h < tb->names.size(); ++h)
    remote += tb->dcs[h] != tb->dcs[0];
  std::printf(
      "bench delta-wan: %zu hosts in %d datacenters (%zu remote readers, %zu "
      "local), host links %.0f Mbit/s, wide-area link W = %.0f Mbit/s; "
      "S = %s bf16 (Adam, lr %g, after %d warm-up steps), chunks of %s; "
      "bound S/W = %.2f s\n",
      tb->names.size(), tb->num_dcs, remote, tb->names.size() - 1 - remote,
      tb->host_mbit, tb->wan_mbit, FormatBytes(s_bytes).c_str(), f.lr,
      f.warmup_steps, FormatBytes(f.chunk_bytes).c_str(),
      s_bytes / w_bytes_per_s);
  std::printf("%-6s %10s %10s %14s %8s %12s %11s\n", "mode", "remote s",
              "local s", "WAN bytes", "/ S", "from delta", "delta wire");
  std::optional<ModeResult> full, delta;
  for (const std::string& mode : {std::string("full"), std::string("delta")}) {
    if (f.modes.find(mode) == std::string::npos) continue;
    Result<ModeResult> r = RunMode(*tb, f, mode == "delta");
    if (!r.ok()) return Fail(r.status().WithContext("mode " + mode));
    std::printf(
        "%-6s %10.2f %10.2f %14llu %8.4f %12s %11s   (%.3f%% of "
        "elements changed)\n",
        mode.c_str(), r->remote_s, r->local_s,
        static_cast<unsigned long long>(r->wan_bytes),
        static_cast<double>(r->wan_bytes) / s_bytes,
        FormatBytes(r->from_delta).c_str(), FormatBytes(r->delta_wire).c_str(),
        100 * r->changed);
    // One line per mode for scripts (tests/testbed/delta_smoke.sh): the
    // figures beside the link's bounds, S/W for the version whole and
    // delta_wire/W for the delta bytes the remote readers read.
    std::printf(
        "delta_wan_result mode=%s ok=1 remote_s=%.3f local_s=%.3f "
        "wan_bytes=%llu wan_per_S=%.4f bound_full_s=%.3f bound_delta_s=%.3f "
        "from_delta_bytes=%llu delta_wire_bytes=%llu delta_readers=%d "
        "remote_readers=%zu changed=%.5f\n",
        mode.c_str(), r->remote_s, r->local_s,
        static_cast<unsigned long long>(r->wan_bytes),
        static_cast<double>(r->wan_bytes) / s_bytes, s_bytes / w_bytes_per_s,
        static_cast<double>(r->delta_wire) / w_bytes_per_s,
        static_cast<unsigned long long>(r->from_delta),
        static_cast<unsigned long long>(r->delta_wire), r->delta_readers,
        remote, r->changed);
    std::fflush(stdout);
    (mode == "full" ? full : delta) = *r;
  }
  if (full.has_value() && delta.has_value()) {
    const double speedup = full->remote_s / delta->remote_s;
    const double wan_s = static_cast<double>(delta->wan_bytes) / s_bytes;
    const double local = delta->local_s / full->local_s;
    std::printf(
        "delta-wan: remote readers %.1fx sooner with deltas (target >= 5x: "
        "%s); wide-area bytes %.4f S (target <= 0.1 S at <= 2%% changed: "
        "%s); local fan-out %.2fx the time without deltas (target: no "
        "slower)\n",
        speedup, speedup >= 5 ? "met" : "NOT met", wan_s,
        wan_s <= 0.1 ? "met" : "NOT met", local);
  }
  return 0;
}

}  // namespace

void AddBenchDeltaWanCommands(CommandLine& cl, CLI::App* bench) {
  for (const char* role : {"_delta-trainer", "_delta-reader"}) {
    auto f = std::make_shared<RoleFlags>();
    const bool trainer = std::string(role) == "_delta-trainer";
    CLI::App* c = cl.Add(
        role, "a test-bed role of bench delta-wan",
        [f, trainer] { return trainer ? RunTrainer(*f) : RunReader(*f); },
        bench);
    f->worker.options.connect_timeout_ms = 30000;
    AddWorkerFlags(c, &f->worker);
    c->add_option("--elements", f->elements);
    c->add_option("--lr", f->lr);
    c->add_option("--warmup-steps", f->warmup_steps);
    c->add_option("--seed", f->seed);
    c->add_option("--chunk-bytes", f->chunk_bytes);
    c->add_option("--connections", f->connections);
  }
  auto f = std::make_shared<WanFlags>();
  CLI::App* c = cl.Add(
      "delta-wan",
      "a new version to the readers of a remote datacenter over a slow "
      "wide-area link, whole against as a delta (bench/delta_wan.sh)",
      [f] { return RunWan(*f); }, bench);
  c->add_option("--testbed", f->testbed,
                "prefix of a bench/testbed.sh test bed of 2 datacenters")
      ->capture_default_str();
  c->add_option("--elements", f->elements, "bf16 weights per version")
      ->check(CLI::Range(uint64_t{1} << 16, uint64_t{1} << 32))
      ->capture_default_str();
  c->add_option("--lr", f->lr, "Adam's learning rate")->capture_default_str();
  c->add_option("--warmup-steps", f->warmup_steps,
                "Adam steps before version 1")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  c->add_option("--seed", f->seed, "the generator's seed")
      ->capture_default_str();
  AddBytesOption(c, "--chunk-bytes", &f->chunk_bytes, "4MiB", "chunk size")
      ->check(CLI::Range(uint64_t{4096}, uint64_t{1} << 30));
  c->add_option("--connections", f->connections, "streams per fetch")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  c->add_option("--port", f->port, "the hub's port on host 0")
      ->capture_default_str();
  c->add_option("--modes", f->modes, "full, delta, or both (full,delta)")
      ->capture_default_str();
}

}  // namespace tensorhub::cli
