// Pieces shared by the benchmarks that run on the multi-host test bed
// (bench/testbed.sh): reading its description, starting the hub and the
// hidden `bench _trainer` / `bench _reader` roles in its namespaces, and
// parsing those roles' reply lines. Used by `bench fanout` and
// `bench workload`. Everything here runs in the driver's thread(s); a
// Subprocess is owned by whoever holds it.
#ifndef TENSORHUB_BENCH_LAB_BENCH_TESTBED_H_
#define TENSORHUB_BENCH_LAB_BENCH_TESTBED_H_

#include <cstdint>
#include <string>
#include <vector>

#include "subprocess.h"
#include "tensorhub/status.h"

namespace tensorhub::cli {

// Test bed description written by bench/testbed.sh up.
struct Testbed {
  std::string prefix, switch_ns;
  std::vector<std::string> names, ips, dcs;
  double host_mbit = 0, wan_mbit = 0;
  int num_dcs = 1;
  // The test bed's "datacenters" stand for racks of one datacenter (their
  // shaped uplinks for rack uplinks): workers are labelled --datacenter dc
  // --rack <its DC>, and the hub is told rack_oversubscription (> 0).
  bool dcs_are_racks = false;
  double rack_oversubscription = 0;

  // {"ip", "netns", "exec", host i's namespace}
  std::vector<std::string> Exec(size_t i) const;
};

Result<Testbed> LoadTestbed(const std::string& prefix);

// Bytes that left datacenter `dc` towards the wide-area link so far.
uint64_t WanTxBytes(const Testbed& t, const std::string& dc);

// The environment of every role process (warnings and errors only).
std::vector<std::string> RoleEnv();

// metrics_port > 0: every role serves Prometheus metrics on its host's
// address, workers at metrics_port and the hub at metrics_port + 1.

// `tensorhub serve` on host 0 at `port`; returns HOST:PORT in *address.
Result<Subprocess> SpawnHub(const Testbed& t, const std::string& port,
                            std::string* address, int metrics_port = 0);

// `bench _trainer` on host 0, waited for until it has registered (its
// worker id in *worker_id). Deadline: 60 s.
Result<Subprocess> SpawnTrainer(const Testbed& t, const std::string& hub,
                                uint64_t bytes, uint64_t chunk_bytes,
                                std::string* worker_id, int metrics_port = 0);

// `bench _reader` named `name` on host `host`; `serve` false is the
// point-to-point baseline (it never serves what it fetched). Does not wait:
// call WaitReady.
Result<Subprocess> SpawnReader(const Testbed& t, size_t host,
                               const std::string& hub, const std::string& name,
                               uint64_t bytes, bool serve, int connections,
                               int metrics_port = 0);
// Reads the role's "ready ID" line; returns ID.
Result<std::string> WaitReady(Subprocess& role, int64_t timeout_ms);

// The trainer role's reply to "publish V [COPIES [TIMEOUT_MS]]":
// "published V DIGEST WAIT_S UNPUBLISH_S FILL_S PUBLISH_S".
struct PublishedReply {
  uint64_t version = 0;
  std::string digest;
  double wait_s = 0;  // until COPIES other workers held the previous version
  double unpublish_s = 0;  // Unpublish of the previous version (drain)
  double fill_s = 0;       // writing the new version into the buffers
  double publish_s = 0;    // the Publish call
};
Result<PublishedReply> ParsePublished(const std::string& line);

// The reader role's reply to "fetch V":
// "fetched V DIGEST SECONDS RETRIES WORKER:BYTES:f|c ...".
struct FetchedReply {
  struct Source {
    std::string worker;
    uint64_t bytes = 0;
    bool was_filling = false;
  };
  uint64_t version = 0;
  std::string digest;
  double seconds = 0;
  uint64_t retries = 0;
  std::vector<Source> sources;

  uint64_t BytesFrom(const std::string& worker) const;
  uint64_t BytesFromFilling() const;
};
Result<FetchedReply> ParseFetched(const std::string& line);

}  // namespace tensorhub::cli

#endif  // TENSORHUB_BENCH_LAB_BENCH_TESTBED_H_
