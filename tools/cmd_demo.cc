// `tensorhub demo`: an embedded hub, one trainer process and N rollout
// processes on this machine, several weight-update rounds of a synthetic
// Qwen2.5-0.5B-shaped bf16 model. Each round the trainer unpublishes the old
// version (draining reads), writes new weights in place and publishes; every
// rollout fetches `latest` into its own buffers (serving what it holds to
// the others) and reports a digest that must equal the trainer's.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>

#include "cli_util.h"
#include "common/log.h"
#include "demo_model.h"
#include "hub/hub_service.h"
#include "subprocess.h"

namespace tensorhub::cli {
namespace {

constexpr char kModel[] = "qwen2.5-0.5b-synthetic";

// Reads one command line from the driver on stdin.
bool NextCommand(std::string* cmd, uint64_t* arg) {
  std::string line;
  if (!std::getline(std::cin, line)) return false;
  std::istringstream in(line);
  in >> *cmd >> *arg;
  return true;
}

// The flags of the demo and of its worker processes.
struct DemoFlags {
  std::string hub;
  std::string name;
  double scale = 1.0;
  uint32_t rollouts = 4;
  uint32_t rounds = 5;
};

int RunDemoTrainer(const DemoFlags& f) {
  SetLogPrefix("trainer");
  SyntheticModel model(QwenLayout(f.scale));
  ClientOptions o;
  o.hub_address = f.hub;
  o.name = "trainer";
  auto client = Client::Connect(o);
  if (!client.ok()) return Fail(client.status());
  std::string cmd;
  uint64_t v = 0, last = 0;
  while (NextCommand(&cmd, &v)) {
    if (cmd != "publish") break;
    int64_t t0 = NowMs();
    if (last != 0) {
      // The mutability contract: drain reads of the old version before the
      // optimizer step overwrites the buffers in place.
      Status s = (*client)->Unpublish(kModel, Version(last), 60000);
      if (!s.ok()) {
        Reply("error " + s.ToString());
        continue;
      }
    }
    int64_t t1 = NowMs();
    model.Fill(v);  // stands in for the optimizer step
    uint64_t digest = model.Digest();
    int64_t t2 = NowMs();
    Status s = (*client)->Publish(kModel, Version(v), model.tensors());
    int64_t t3 = NowMs();
    if (!s.ok()) {
      Reply("error " + s.ToString());
      continue;
    }
    last = v;
    Reply("published " + std::to_string(v) + " " + Hex(digest) + " " +
          std::to_string(t1 - t0) + " " + std::to_string(t2 - t1) + " " +
          std::to_string(t3 - t2));
  }
  return 0;
}

int RunDemoRollout(const DemoFlags& f) {
  SetLogPrefix(f.name.c_str());
  SyntheticModel model(QwenLayout(f.scale));
  ClientOptions o;
  o.hub_address = f.hub;
  o.name = f.name;
  auto client = Client::Connect(o);
  if (!client.ok()) return Fail(client.status());
  std::string cmd;
  uint64_t arg = 0;
  while (NextCommand(&cmd, &arg)) {
    if (cmd != "fetch") break;
    FetchOptions fo;
    fo.timeout_ms = 120000;
    auto st = (*client)->Fetch(kModel, Version::Latest(), model.tensors(), fo);
    if (!st.ok()) {
      Reply("error " + st.status().ToString());
      continue;
    }
    char buf[256];
    std::snprintf(buf, sizeof(buf), "fetched %" PRIu64 " %s %.3f %.3f %u %u",
                  st->version.value(), Hex(model.Digest()).c_str(), st->seconds,
                  st->bytes / st->seconds / 1e9, st->sources_used,
                  st->chunk_retries);
    Reply(buf);
  }
  return 0;
}

int RunDemo(const DemoFlags& f) {
  SetLogPrefix("demo");
  // The table is the output; the hub's join/leave lines would interleave.
  if (std::getenv("TENSORHUB_LOG") == nullptr) SetLogLevel(LogLevel::kWarn);
  hub::HubServerOptions ho;
  ho.listen_address = "127.0.0.1:0";
  auto hub = hub::HubServer::Start(ho);
  if (!hub.ok()) return Fail(hub.status());
  const std::string hub_addr = (*hub)->address();
  std::vector<TensorSpec> layout = QwenLayout(f.scale);
  uint64_t bytes = 0;
  for (const TensorSpec& s : layout) bytes += *s.ByteSize();
  std::printf(
      "TensorHub demo: hub %s, 1 trainer + %llu rollout processes, %llu "
      "rounds\n",
      hub_addr.c_str(), static_cast<unsigned long long>(f.rollouts),
      static_cast<unsigned long long>(f.rounds));
  std::printf(
      "model %s: %zu bf16 tensors, %s (Qwen2.5-0.5B layout, scale %.2f)\n\n",
      kModel, layout.size(), FormatBytes(bytes).c_str(), f.scale);
  std::fflush(stdout);

  const std::vector<std::string> env = {"TENSORHUB_LOG=warn"};
  std::string scale_s = std::to_string(f.scale);
  auto trainer = Subprocess::Spawn(
      {"_demo-trainer", "--hub", hub_addr, "--scale", scale_s}, env);
  if (!trainer.ok()) return Fail(trainer.status());
  std::vector<Subprocess> workers;
  for (uint64_t i = 0; i < f.rollouts; ++i) {
    auto w =
        Subprocess::Spawn({"_demo-rollout", "--hub", hub_addr, "--scale",
                           scale_s, "--name", "rollout-" + std::to_string(i)},
                          env);
    if (!w.ok()) return Fail(w.status());
    workers.push_back(std::move(w).value());
  }

  bool all_ok = true;
  double total_wait = 0, max_wait = 0;
  for (uint64_t r = 1; r <= f.rounds; ++r) {
    Status s = trainer->Send("publish " + std::to_string(r));
    auto line = s.ok() ? trainer->ReadLine(Deadline::AfterMs(180000))
                       : Result<std::string>(s);
    if (!line.ok()) return Fail(line.status().WithContext("trainer"));
    std::istringstream in(*line);
    std::string word, digest;
    uint64_t v = 0, drain_ms = 0, step_ms = 0, publish_ms = 0;
    in >> word >> v >> digest >> drain_ms >> step_ms >> publish_ms;
    if (word != "published") return Fail(Internal("trainer: " + *line));
    std::printf(
        "round %llu: trainer published v%llu (drain old %llu ms, write %llu "
        "ms, "
        "publish %llu ms), digest %s\n",
        static_cast<unsigned long long>(r), static_cast<unsigned long long>(v),
        static_cast<unsigned long long>(drain_ms),
        static_cast<unsigned long long>(step_ms),
        static_cast<unsigned long long>(publish_ms), digest.c_str());
    for (Subprocess& w : workers) {
      if (Status ws = w.Send("fetch " + std::to_string(v)); !ws.ok())
        return Fail(ws);
    }
    std::printf("  %-10s %8s %9s %12s %8s %8s  %s\n", "rollout", "version",
                "wait(s)", "rate", "sources", "retries", "bytes");
    for (size_t i = 0; i < workers.size(); ++i) {
      auto reply = workers[i].ReadLine(Deadline::AfterMs(180000));
      if (!reply.ok())
        return Fail(reply.status().WithContext("rollout-" + std::to_string(i)));
      std::istringstream rin(*reply);
      std::string rword, rdigest;
      uint64_t rv = 0;
      double secs = 0, gbps = 0;
      unsigned sources = 0, retries = 0;
      rin >> rword >> rv >> rdigest >> secs >> gbps >> sources >> retries;
      if (rword != "fetched") {
        std::printf("  %-10s FAILED: %s\n",
                    ("rollout-" + std::to_string(i)).c_str(), reply->c_str());
        all_ok = false;
        continue;
      }
      bool match = rv == v && rdigest == digest;
      all_ok = all_ok && match;
      total_wait += secs;
      max_wait = std::max(max_wait, secs);
      std::printf("  %-10s %8llu %9.3f %12s %8u %8u  %s\n",
                  ("rollout-" + std::to_string(i)).c_str(),
                  static_cast<unsigned long long>(rv), secs,
                  FormatRate(gbps * 1e9).c_str(), sources, retries,
                  match ? "match" : "MISMATCH");
    }
    std::fflush(stdout);
  }
  (void)trainer->Send("quit");
  for (Subprocess& w : workers) (void)w.Send("quit");
  trainer->Stop(5000);
  for (Subprocess& w : workers) w.Stop(5000);
  (*hub)->Shutdown();
  std::printf(
      "\n%s: %llu rounds x %zu rollouts, mean wait %.3f s, max wait %.3f s\n",
      all_ok ? "OK" : "FAILED", static_cast<unsigned long long>(f.rounds),
      workers.size(), total_wait / (f.rounds * workers.size()), max_wait);
  return all_ok ? 0 : 1;
}

}  // namespace

void AddDemoCommands(CommandLine& cl) {
  auto f = std::make_shared<DemoFlags>();
  CLI::App* c = cl.Add("demo",
                       "a hub, a trainer and N rollout processes updating a "
                       "~1 GB model, every copy checked",
                       [f] { return RunDemo(*f); });
  c->add_option("--rollouts", f->rollouts, "rollout processes")
      ->check(CLI::Range(1u, 32u))
      ->capture_default_str();
  c->add_option("--rounds", f->rounds, "weight-update rounds")
      ->check(CLI::Range(1u, 1000u))
      ->capture_default_str();
  c->add_option("--scale", f->scale,
                "model size as a fraction of Qwen2.5-0.5B's layout")
      ->check(CLI::Range(1e-6, 1.0))
      ->capture_default_str();
  // The demo's worker processes (it spawns them with these flags).
  for (const bool trainer : {true, false}) {
    auto w = std::make_shared<DemoFlags>();
    c = cl.Add(trainer ? "_demo-trainer" : "_demo-rollout",
               "a worker process of the demo", [w, trainer] {
                 return trainer ? RunDemoTrainer(*w) : RunDemoRollout(*w);
               });
    c->add_option("--hub", w->hub)->required();
    c->add_option("--scale", w->scale)->check(CLI::Range(1e-6, 1.0));
    if (!trainer) c->add_option("--name", w->name)->required();
  }
}

}  // namespace tensorhub::cli
