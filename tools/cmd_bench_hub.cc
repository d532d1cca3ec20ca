// `tensorhub bench hub`: the hub's state machine (the same code the hub
// process runs, without the RPC layer) driven by N simulated workers:
// registration, a round of heartbeats, and scheduling one version for all of
// them (each reader: AddHolder filling, Schedule, AddHolder complete). Prints
// the hub CPU time of each phase and the scheduling latency percentiles.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "cli_util.h"
#include "hub/hub_state.h"

namespace tensorhub::cli {
namespace {

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

}  // namespace

int CmdBenchHub(int argc, char** argv) {
  auto args = ParseArgs(argc, argv, 3, {"workers", "tensors", "chunks"}, {});
  if (!args.ok()) return Fail(args.status());
  auto workers = args->GetU64("workers", 10000);
  auto tensors = args->GetU64("tensors", 1000);
  auto chunks = args->GetU64("chunks", 4096);
  for (const Status& s : {workers.status(), tensors.status(), chunks.status()}) {
    if (!s.ok()) return Fail(s);
  }
  if (*workers < 2 || *workers > 100000) return Fail(InvalidArgument("--workers must be in [2, 100000]"));
  if (*tensors < 1 || *tensors > 100000 || *chunks < *tensors || *chunks > 1000000) {
    return Fail(InvalidArgument("need 1 <= --tensors <= --chunks <= 1000000"));
  }
  hub::HubConfig config;
  config.lease_ms = 60000;
  hub::HubState hub(config);
  int64_t now = 0;

  // A manifest of `tensors` tensors cut into `chunks` chunks of 64 MiB
  // (checksums are arbitrary: the hub never sees bytes).
  const uint64_t chunk_bytes = 64ull << 20;
  PartLayout part;
  uint64_t per_tensor = *chunks / *tensors * chunk_bytes;
  for (uint64_t i = 0; i < *tensors; ++i) {
    part.tensors.push_back({{"t" + std::to_string(i), DType::kU8, {per_tensor}}, part.part_bytes, per_tensor});
    part.part_bytes += per_tensor;
  }
  for (uint64_t c = 0; c < ChunksFor(part.part_bytes, chunk_bytes); ++c) part.chunk_xxh3.push_back(c * 2654435761u);
  Manifest manifest(1, chunk_bytes, {part});
  if (Status s = manifest.Validate(); !s.ok()) return Fail(s);

  std::printf("bench hub: %llu workers, one version of %zu tensors in %llu chunks (%s)\n",
              static_cast<unsigned long long>(*workers), part.tensors.size(),
              static_cast<unsigned long long>(manifest.num_chunks()),
              FormatBytes(manifest.total_bytes()).c_str());
  // 8 workers per host, 16 hosts per rack, 4 racks per datacenter.
  std::vector<WorkerId> ids;
  double t0 = ThreadCpuSeconds();
  for (uint64_t i = 0; i < *workers; ++i) {
    hub::WorkerRegistration reg;
    reg.name = "w" + std::to_string(i);
    reg.data_address = "10.0." + std::to_string(i / 256) + "." + std::to_string(i % 256) + ":7000";
    reg.labels = {"dc" + std::to_string(i / 512), "rack" + std::to_string(i / 128),
                  "host" + std::to_string(i / 8)};
    auto id = hub.RegisterWorker(reg, now);
    if (!id.ok()) return Fail(id.status());
    ids.push_back(*id);
  }
  double t1 = ThreadCpuSeconds();
  for (const WorkerId& id : ids) {
    if (Status s = hub.Heartbeat(id, ++now); !s.ok()) return Fail(s);
  }
  double t2 = ThreadCpuSeconds();
  hub::PublishArgs a;
  a.worker = ids[0];
  a.model = "m";
  a.version = Version(1);
  a.chunk_bytes = chunk_bytes;
  a.part = part;
  a.epoch = 1;
  auto st = hub.Publish(a, now);
  if (!st.ok()) return Fail(st.status());
  double t3 = ThreadCpuSeconds();
  std::vector<double> sched_us;
  sched_us.reserve(ids.size());
  // Readers arrive in order; each registers as filling, is scheduled, and
  // completes before the next arrives (the hub's worst case for the size
  // of the candidate set).
  for (size_t i = 1; i < ids.size(); ++i) {
    if (Status s = hub.AddHolder(ids[i], "m", Version(1), 1, manifest, now, true); !s.ok()) return Fail(s);
    double s0 = ThreadCpuSeconds();
    auto srcs = hub.Schedule(ids[i], "m", Version(1), {}, 4);
    double s1 = ThreadCpuSeconds();
    if (!srcs.ok()) return Fail(srcs.status());
    sched_us.push_back((s1 - s0) * 1e6);
  }
  for (size_t i = 1; i < ids.size(); ++i) {
    if (Status s = hub.AddHolder(ids[i], "m", Version(1), 1, manifest, now); !s.ok()) return Fail(s);
  }
  double t4 = ThreadCpuSeconds();
  std::sort(sched_us.begin(), sched_us.end());
  auto pct = [&](double p) { return sched_us[static_cast<size_t>(p * (sched_us.size() - 1))]; };
  std::printf("  register %llu workers      %8.3f s CPU\n", static_cast<unsigned long long>(*workers), t1 - t0);
  std::printf("  one heartbeat each        %8.3f s CPU\n", t2 - t1);
  std::printf("  publish (the manifest)    %8.3f s CPU\n", t3 - t2);
  std::printf("  schedule the version for %llu readers (filling + schedule + complete): %.3f s CPU "
              "(target < 1 s)\n", static_cast<unsigned long long>(*workers - 1), t4 - t3);
  std::printf("  Schedule() latency: p50 %.1f us, p99 %.1f us, max %.1f us\n", pct(0.5), pct(0.99),
              sched_us.back());
  return 0;
}

}  // namespace tensorhub::cli
