// `tensorhub-lab sim`: the flow-level simulator (src/sim) at cluster scale. It
// drives the hub's own scheduling code (HubState) with simulated GPUs and a
// simulated clock, and runs the baselines on the same simulated links.
//
//   --scenario standalone  512 trainer + 512 rollout GPUs, 70B bf16, TP=8
//   --scenario elastic     the same with half the rollout instances spot
//   --scenario crossdc     the rollouts in a second datacenter behind a WAN
//   --scenario scale       16,384 GPUs (8,192 + 8,192), standalone
//   --scenario testbed     the namespace test bed's configuration, beside
//                          the measured figures in bench/results/
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli_util.h"
#include "sim/workload.h"

namespace tensorhub::cli {
namespace {

using sim::RunResult;
using sim::System;
using sim::WorkloadConfig;

// Overrides of a scenario's configuration: each set only when given.
struct SimFlags {
  std::string scenario = "standalone";
  bool csv = false;
  std::optional<int> trainer_gpus, rollout_gpus, tp, tensors, gpus_per_node,
      nodes_per_rack, rounds, max_sources, trainer_copies;
  std::optional<uint64_t> model_bytes, chunk_bytes, segment_bytes,
      cut_through_bytes, seed;
  std::optional<double> nic_gbit, nvlink_gbyte, rack_oversub, wan_gbit,
      efficiency, step_s, spot_fraction, arrival_spread_s;
  bool no_rack_labels = false;
  bool hub_idle_first = false;
  std::optional<std::string> measured;
  std::optional<std::string> systems;
};

Status Apply(const SimFlags& f, WorkloadConfig* c) {
  auto set = [](const auto& flag, auto* field) {
    if (flag.has_value()) *field = *flag;
  };
  set(f.trainer_gpus, &c->trainer_gpus);
  set(f.rollout_gpus, &c->rollout_gpus);
  if (f.model_bytes.has_value()) {
    c->model_bytes = static_cast<double>(*f.model_bytes);
  }
  set(f.tp, &c->tp);
  set(f.tensors, &c->tensors);
  set(f.chunk_bytes, &c->chunk_bytes);
  set(f.segment_bytes, &c->segment_bytes);
  set(f.cut_through_bytes, &c->cut_through_bytes);
  set(f.nic_gbit, &c->cluster.nic_gbit);
  set(f.nvlink_gbyte, &c->cluster.nvlink_gbyte);
  set(f.gpus_per_node, &c->cluster.gpus_per_node);
  set(f.nodes_per_rack, &c->cluster.nodes_per_rack);
  set(f.rack_oversub, &c->cluster.rack_oversub);
  set(f.wan_gbit, &c->cluster.wan_gbit);
  set(f.efficiency, &c->cluster.efficiency);
  if (f.no_rack_labels) c->cluster.rack_labels = false;
  if (f.hub_idle_first) c->hub_idle_first = true;
  set(f.rounds, &c->rounds);
  set(f.step_s, &c->step_s);
  set(f.max_sources, &c->max_sources);
  set(f.trainer_copies, &c->trainer_copies);
  set(f.spot_fraction, &c->spot_fraction);
  set(f.arrival_spread_s, &c->arrival_spread_s);
  set(f.seed, &c->seed);
  return c->Validate();
}

void PrintConfig(const std::string& scenario, const WorkloadConfig& c) {
  std::printf(
      "# sim scenario=%s gpus=%d (trainer %d + rollout %d%s) model=%.1f GB "
      "tp=%d shard=%.2f GB in %d tensors "
      "chunk=%s cut-through=%s segment=%s\n#   nic=%.0f Gbit/s per GPU, %d "
      "GPUs/node, nvlink "
      "%.0f GB/s, "
      "%d nodes/rack%s, rack oversubscription %.2g%s%s, wan=%.0f Gbit/s, "
      "efficiency %.3f\n"
      "#   rounds=%d step=%.1f s arrival_spread=%.2f s max_sources=%d "
      "trainer_copies=%d spot_fraction=%.2f seed=%" PRIu64 "\n",
      scenario.c_str(), c.trainer_gpus + c.rollout_gpus, c.trainer_gpus,
      c.rollout_gpus, c.rollouts_remote ? ", rollouts in dc1" : "",
      c.model_bytes / 1e9, c.tp, c.shard_bytes() / 1e9, c.tensors,
      FormatBytes(c.chunk_bytes).c_str(),
      c.cut_through_bytes > 0 ? FormatBytes(c.cut_through_bytes).c_str()
                              : "off",
      FormatBytes(c.segment_bytes).c_str(), c.cluster.nic_gbit,
      c.cluster.gpus_per_node, c.cluster.nvlink_gbyte, c.cluster.nodes_per_rack,
      c.cluster.rack_labels ? "" : " (racks not told to the hub)",
      c.cluster.rack_oversub,
      c.cluster.rack_oversub > 0 ? "" : " (no rack limit)",
      c.cluster.rack_oversub <= 1 ? ""
      : c.hub_idle_first          ? " (hub not told: idle first)"
                                  : " (hub told: rack-aware pipelines)",
      c.cluster.wan_gbit, c.cluster.efficiency, c.rounds, c.step_s,
      c.arrival_spread_s, c.max_sources, c.trainer_copies, c.spot_fraction,
      c.seed);
}

void CsvHeader() {
  std::printf(
      "scenario,system,gpus,update_s,update_max_s,bound_s,update_over_bound,"
      "trainer_blocked_s,"
      "trainer_stall_gpu_s,rollout_stall_gpu_s,total_stall_gpu_s,stall_ratio_"
      "vs_tensorhub,"
      "regular_wait_mean_s,joiners,joiner_wait_mean_s,joiner_wait_max_s,"
      "schedule_calls,"
      "source_losses,failed_fetches,wan_fetches,events,wall_s,recheck_calls,"
      "last_arrival_s,update_over_arrival_bound\n");
}

void CsvRow(const std::string& scenario, const WorkloadConfig& c,
            const RunResult& r, double th_stall) {
  double lb = c.LowerBoundS();
  std::printf(
      "%s,%s,%d,%.6f,%.6f,%.6f,%.4f,%.6f,%.3f,%.3f,%.3f,%.4f,%.6f,%d,%.6f,%.6f,"
      "%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64
      ",%.3f,%" PRIu64 ",%.6f,%.4f\n",
      scenario.c_str(), sim::SystemName(r.system),
      c.trainer_gpus + c.rollout_gpus, r.update_s, r.update_max_s, lb,
      r.update_s / lb, r.trainer_blocked_s, r.trainer_stall_gpu_s,
      r.rollout_stall_gpu_s, r.total_stall_gpu_s(),
      th_stall > 0 ? r.total_stall_gpu_s() / th_stall : 0.0,
      r.regular_wait_mean_s, r.joiners, r.joiner_wait_mean_s,
      r.joiner_wait_max_s, r.schedule_calls, r.source_losses, r.failed_fetches,
      r.wan_fetches, r.events, r.wall_s, r.recheck_calls, r.last_arrival_s,
      r.update_s / c.ArrivalBoundS(r.last_arrival_s));
}

Result<std::vector<System>> ParseSystems(const std::string& text,
                                         bool elastic) {
  std::vector<System> out;
  std::stringstream ss(text);
  std::string s;
  while (std::getline(ss, s, ',')) {
    if (s == "tensorhub")
      out.push_back(System::kTensorHub);
    else if (s == "p2p")
      out.push_back(System::kPointToPoint);
    else if (s == "ring")
      out.push_back(System::kRing);
    else if (s == "tree")
      out.push_back(System::kTree);
    else
      return InvalidArgument("--systems: unknown system '" + s +
                             "' (tensorhub,p2p,ring,tree)");
  }
  if (out.empty() || out[0] != System::kTensorHub) {
    return InvalidArgument(
        "--systems must start with tensorhub (the ratios are against it)");
  }
  if (elastic) {
    for (System x : out) {
      if (x == System::kRing || x == System::kTree) {
        return InvalidArgument(
            "elastic: a static broadcast group takes no joiners; use "
            "tensorhub,p2p");
      }
    }
  }
  return out;
}

int RunScenario(const std::string& scenario, const WorkloadConfig& c,
                const std::vector<System>& systems, bool csv) {
  const bool elastic = c.spot_fraction > 0;
  std::vector<RunResult> results;
  for (System s : systems) {
    Result<RunResult> r = sim::RunWorkload(c, s);
    if (!r.ok()) {
      std::fprintf(stderr, "sim %s %s: %s\n", scenario.c_str(),
                   sim::SystemName(s), r.status().ToString().c_str());
      return 1;
    }
    results.push_back(*r);
  }
  // Elastic: the same runs without joiners, to see the slowdown they cause.
  std::vector<RunResult> calm;
  if (elastic) {
    WorkloadConfig quiet = c;
    quiet.spot_fraction = 0;
    quiet.rollout_gpus =
        c.rollout_gpus - c.tp * static_cast<int>(std::floor(
                                    c.rollout_gpus / c.tp * c.spot_fraction));
    for (System s : systems) {
      Result<RunResult> r = sim::RunWorkload(quiet, s);
      if (!r.ok()) {
        std::fprintf(stderr, "sim %s (no joiners) %s: %s\n", scenario.c_str(),
                     sim::SystemName(s), r.status().ToString().c_str());
        return 1;
      }
      calm.push_back(*r);
    }
  }
  const double th_stall = results[0].total_stall_gpu_s();
  if (csv) {
    for (const RunResult& r : results) CsvRow(scenario, c, r, th_stall);
    for (const RunResult& r : calm)
      CsvRow(scenario + "-nojoin", c, r, calm[0].total_stall_gpu_s());
    return 0;
  }
  PrintConfig(scenario, c);
  const double lb = c.LowerBoundS();
  std::string terms = "shard / NIC";
  if (c.remote_gpus() > 0) terms += ", model / WAN";
  const double rack_lb = c.RackBoundS();
  if (c.cluster.rack_oversub > 1) {
    char buf[96];
    std::snprintf(buf, sizeof(buf), ", rack uplinks (%.3f s)", rack_lb);
    terms += buf;
  }
  std::printf("# lower bound per update: %s%s%s = %.3f s\n",
              terms.find(',') != std::string::npos ? "max(" : "", terms.c_str(),
              terms.find(',') != std::string::npos ? ")" : "", lb);
  if (c.arrival_spread_s > 0) {
    std::printf(
        "# with arrival spread: x_arrival = update / the arrival-adjusted "
        "bound, max(the bound, the last instance's arrival + shard / NIC) = "
        "max(%.3f, %.3f + %.3f) = %.3f s\n",
        lb, results[0].last_arrival_s, c.NicBoundS(),
        c.ArrivalBoundS(results[0].last_arrival_s));
  }
  std::printf("%-11s %10s %8s %9s %10s %14s %14s %14s %10s %9s %8s %9s %8s\n",
              "system", "update_s", "x_bound", "x_arrival", "trainer_s",
              "trainer_gpu_s", "rollout_gpu_s", "stall_gpu_s", "stall/TH",
              "schedule", "recheck", "events", "wall_s");
  for (const RunResult& r : results) {
    std::printf(
        "%-11s %10.3f %8.2f %9.3f %10.3f %14.1f %14.1f %14.1f %9.2fx %9" PRIu64
        " %8" PRIu64 " %9" PRIu64 " %8.1f\n",
        sim::SystemName(r.system), r.update_s, r.update_s / lb,
        r.update_s / c.ArrivalBoundS(r.last_arrival_s), r.trainer_blocked_s,
        r.trainer_stall_gpu_s, r.rollout_stall_gpu_s, r.total_stall_gpu_s(),
        r.total_stall_gpu_s() / th_stall, r.schedule_calls, r.recheck_calls,
        r.events, r.wall_s);
  }
  for (const RunResult& r : results) {
    if (r.failed_fetches > 0 || r.source_losses > 0) {
      std::printf("# %s: %" PRIu64 " sources lost mid-fetch (masked), %" PRIu64
                  " fetches failed\n",
                  sim::SystemName(r.system), r.source_losses, r.failed_fetches);
    }
  }
  if (elastic) {
    std::printf(
        "# elastic: joiner = a spot instance's time from joining to holding "
        "the newest version (all %d GPUs); left = spot instances that left "
        "before that\n",
        c.tp);
    std::printf("%-11s %8s %6s %12s %12s %12s %16s %16s %10s\n", "system",
                "joiners", "left", "join_mean_s", "join_max_s", "join/TH",
                "regular_wait_s", "no_joiners_s", "slowdown");
    for (size_t k = 0; k < results.size(); ++k) {
      const RunResult& r = results[k];
      std::printf("%-11s %8d %6d %12.3f %12.3f %11.2fx %16.3f %16.3f %9.2fx\n",
                  sim::SystemName(r.system), r.joiners, r.joiners_left_early,
                  r.joiner_wait_mean_s, r.joiner_wait_max_s,
                  results[0].joiner_wait_mean_s > 0
                      ? r.joiner_wait_mean_s / results[0].joiner_wait_mean_s
                      : 0.0,
                  r.regular_wait_mean_s, calm[k].regular_wait_mean_s,
                  calm[k].regular_wait_mean_s > 0
                      ? r.regular_wait_mean_s / calm[k].regular_wait_mean_s
                      : 0.0);
    }
  }
  std::printf(
      "# stall = trainer GPUs x time the trainer is blocked (until every shard "
      "it "
      "published may be modified) + rollout GPUs x time each instance waits "
      "for weights\n");
  return 0;
}

// ---- testbed validation -------------------------------------------------

struct Measured {
  std::string file;
  bool crossdc = false;
  std::string mode;
  int readers = 0;
  double bytes = 0;
  double seconds = 0;
  uint64_t chunk = 0;
  // Lines of bench fanout since cut-through say its piece (older ones
  // were measured without: 0).
  uint64_t cut_through = 0;
  // bench fanout --racks: the test bed's DCs were racks of one datacenter.
  int racks = 0;
  double rack_mbit = 0;
  double hub_oversub = 0;  // what the hub was told (0: nothing)
};

std::map<std::string, std::string> KeyValues(const std::string& line) {
  std::map<std::string, std::string> kv;
  std::stringstream ss(line);
  std::string tok;
  while (ss >> tok) {
    auto eq = tok.find('=');
    if (eq != std::string::npos) kv[tok.substr(0, eq)] = tok.substr(eq + 1);
  }
  return kv;
}

Result<std::vector<Measured>> ReadMeasured(const std::string& spec) {
  std::vector<Measured> out;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    auto colon = item.rfind(':');
    if (colon == std::string::npos) {
      return InvalidArgument(
          "--measured wants FILE:CHUNK[,FILE:CHUNK...], got '" + item + "'");
    }
    std::string file = item.substr(0, colon);
    TH_ASSIGN_OR_RETURN(uint64_t chunk, ParseBytes(item.substr(colon + 1)));
    std::ifstream in(file);
    if (!in) return NotFound("cannot read measured results '" + file + "'");
    std::string line;
    int lines = 0;
    while (std::getline(in, line) && ++lines < 100000) {
      bool xdc = line.rfind("crossdc fanout ", 0) == 0;
      if (!xdc && line.rfind("fanout ", 0) != 0) continue;
      auto kv = KeyValues(line);
      if (kv["ok"] != "1" || (kv["mode"] != "tensorhub" && kv["mode"] != "p2p"))
        continue;
      Measured m;
      m.file = file;
      m.crossdc = xdc;
      m.mode = kv["mode"];
      m.readers = std::atoi(kv["readers"].c_str());
      m.bytes = std::atof(kv["bytes"].c_str());
      m.seconds = std::atof(kv["seconds"].c_str());
      m.chunk = chunk;
      m.cut_through = std::strtoull(kv["cut_through"].c_str(), nullptr, 10);
      m.racks = std::atoi(kv["racks"].c_str());
      m.rack_mbit = std::atof(kv["rack_mbit"].c_str());
      m.hub_oversub = std::atof(kv["hub_oversub"].c_str());
      if (m.racks < 0 || m.racks > 64 || (m.racks > 0 && !(m.rack_mbit > 0))) {
        return InvalidArgument("malformed racks in " + file + ": " + line);
      }
      if (m.readers < 1 || m.readers > 4096 || !(m.bytes > 0) ||
          !(m.seconds > 0)) {
        return InvalidArgument("malformed result line in " + file + ": " +
                               line);
      }
      out.push_back(m);
    }
  }
  if (out.empty())
    return NotFound("no fanout result lines in --measured files");
  return out;
}

int Testbed(const SimFlags& a, bool csv) {
  // bench/fanout.sh's defaults: 400 Mbit/s host links (both directions),
  // WAN 100 Mbit/s, 8 hosts in 2 DCs for the cross-DC run. tbf counts
  // Ethernet framing: TCP payload gets at most 0.956 of the rate
  // (docs/benchmarks.md), which the model applies as link efficiency.
  std::string spec = a.measured.value_or(
      "bench/results/fanout.txt:2MiB,bench/results/fanout-16-1mib.txt:1MiB,"
      "bench/results/crossdc-1mib.txt:1MiB,bench/results/"
      "fanout-racks.txt:4MiB");
  Result<std::vector<Measured>> ms = ReadMeasured(spec);
  if (!ms.ok()) {
    std::fprintf(stderr, "sim testbed: %s\n", ms.status().ToString().c_str());
    return 1;
  }
  if (csv) {
    std::printf(
        "file,crossdc,mode,readers,chunk_bytes,measured_s,sim_s,bound_s,"
        "error\n");
  } else {
    std::printf(
        "# sim scenario=testbed: host links 400 Mbit/s (x efficiency), WAN 100 "
        "Mbit/s (racks rows: the test bed's DCs as racks, uplinks as "
        "measured), one trainer; bound S/B (racks: max(S/B, S/uplink))\n");
    std::printf("%-34s %-8s %-9s %7s %7s %10s %8s %8s %8s\n", "measured file",
                "run", "system", "readers", "chunk", "measured", "sim_s",
                "bound_s", "error");
  }
  double worst = 0;
  for (const Measured& m : *ms) {
    WorkloadConfig c;
    c.cluster.gpus_per_node = 1;
    c.cluster.nodes_per_rack = 1 << 20;
    c.cluster.rack_oversub = 0;
    c.cluster.nic_gbit = 0.4;
    c.cluster.wan_gbit = 0.1;
    c.cluster.efficiency = 0.956;
    c.tp = 1;
    c.model_bytes = m.bytes;
    c.chunk_bytes = m.chunk;
    c.cut_through_bytes = m.cut_through;
    c.rounds = 1;
    c.step_s = 0;
    if (m.racks > 0) {
      // testbed.sh --dcs R as racks: host i in rack i * R / hosts, blocks
      // of hosts / R (the trainer, h0, in the first); each rack's uplink
      // shaped to rack_mbit both ways.
      const int hosts = m.readers + 1;
      c.trainer_gpus = 1;
      c.rollout_gpus = m.readers;
      c.cluster.nodes_per_rack = hosts / m.racks;
      c.cluster.rack_oversub =
          c.cluster.nodes_per_rack * c.cluster.nic_gbit * 1000 / m.rack_mbit;
      if (m.hub_oversub > 0) {
        c.hub_idle_first = false;
      } else {
        c.hub_idle_first = true;
      }
    } else if (m.crossdc) {
      // readers + 1 hosts in 2 DCs; testbed.sh puts host i in DC
      // i * 2 / hosts, so dc0 has ceil(hosts / 2) of them, the trainer
      // (h0) among them (7 readers: 3 local, 4 remote).
      const int hosts = m.readers + 1;
      c.trainer_gpus = 1;
      c.rollout_gpus = m.readers;
      c.remote_rollout_gpus = hosts - (hosts + 1) / 2;
    } else {
      c.trainer_gpus = 1;
      c.rollout_gpus = m.readers;
    }
    Status st = Apply(a, &c);
    if (!st.ok()) {
      std::fprintf(stderr, "sim testbed: %s\n", st.ToString().c_str());
      return 1;
    }
    Result<RunResult> r = sim::RunWorkload(
        c, m.mode == "tensorhub" ? System::kTensorHub : System::kPointToPoint);
    if (!r.ok()) {
      std::fprintf(stderr, "sim testbed: %s\n", r.status().ToString().c_str());
      return 1;
    }
    double sim_s = r->update_s;
    double bound = m.bytes / (0.4e9 / 8);
    if (m.crossdc) bound = m.bytes / (0.1e9 / 8);
    if (m.racks > 0) bound = std::max(bound, m.bytes / (m.rack_mbit * 1e6 / 8));
    double err = (sim_s - m.seconds) / m.seconds;
    worst = std::max(worst, std::fabs(err));
    if (csv) {
      std::printf("%s,%d,%s,%d,%" PRIu64 ",%.3f,%.3f,%.3f,%.4f\n",
                  m.file.c_str(), m.crossdc, m.mode.c_str(), m.readers, m.chunk,
                  m.seconds, sim_s, bound, err);
    } else {
      std::printf("%-34s %-8s %-9s %7d %7s %9.2fs %7.2fs %7.2fs %+7.1f%%\n",
                  m.file.c_str(),
                  m.racks > 0 ? "racks"
                  : m.crossdc ? "crossdc"
                              : "fanout",
                  m.mode.c_str(), m.readers, FormatBytes(m.chunk).c_str(),
                  m.seconds, sim_s, bound, err * 100);
    }
  }
  if (!csv) std::printf("# largest error %.1f%% (target 20%%)\n", worst * 100);
  return 0;
}

int RunSim(const SimFlags& a) {
  const std::string& scenario = a.scenario;
  const bool csv = a.csv;
  if (scenario == "testbed") return Testbed(a, csv);
  WorkloadConfig c;
  std::string systems = "tensorhub,p2p,ring,tree";
  if (scenario == "standalone") {
  } else if (scenario == "elastic") {
    c.spot_fraction = 0.5;
    c.rounds = 4;
    systems = "tensorhub,p2p";
  } else if (scenario == "crossdc") {
    c.rollouts_remote = true;
  } else if (scenario == "scale") {
    c.trainer_gpus = 8192;
    c.rollout_gpus = 8192;
    c.rounds = 1;
  } else {
    std::fprintf(stderr,
                 "sim: --scenario standalone|elastic|crossdc|scale|testbed\n");
    return 2;
  }
  Status st = Apply(a, &c);
  if (!st.ok()) {
    std::fprintf(stderr, "sim: %s\n", st.ToString().c_str());
    return 2;
  }
  Result<std::vector<System>> sys =
      ParseSystems(a.systems.value_or(systems), c.spot_fraction > 0);
  if (!sys.ok()) {
    std::fprintf(stderr, "sim: %s\n", sys.status().ToString().c_str());
    return 2;
  }
  if (csv) CsvHeader();
  return RunScenario(scenario, c, *sys, csv);
}

}  // namespace

void AddSimCommand(CommandLine& cl) {
  auto f = std::make_shared<SimFlags>();
  CLI::App* c = cl.Add("sim",
                       "cluster-scale simulation of the hub's scheduler and "
                       "the baselines, on simulated links",
                       [f] { return RunSim(*f); });
  c->add_option("--scenario", f->scenario,
                "standalone (512 + 512 GPUs, 70B), elastic (half the "
                "rollouts spot), crossdc (rollouts behind a WAN), scale "
                "(16,384 GPUs), testbed (the namespace test bed, beside "
                "bench/results/)")
      ->check(CLI::IsMember(
          {"standalone", "elastic", "crossdc", "scale", "testbed"}))
      ->capture_default_str();
  c->add_flag("--csv", f->csv, "CSV rows instead of the table");
  c->add_option("--systems", f->systems,
                "comma-separated, of tensorhub,p2p,ring,tree");
  c->add_option("--measured", f->measured,
                "testbed: FILE:CHUNK,... of measured fanout result lines");
  // Overrides of the scenario's configuration.
  auto count = [c](const char* name, std::optional<int>* v, const char* what) {
    c->add_option(name, *v, what)->check(CLI::NonNegativeNumber);
  };
  auto real = [c](const char* name, std::optional<double>* v,
                  const char* what) {
    c->add_option(name, *v, what)->check(CLI::NonNegativeNumber);
  };
  auto size = [c](const char* name, std::optional<uint64_t>* v,
                  const char* what) {
    c->add_option(name, *v, what)
        ->transform(SizeTransform())
        ->type_name("SIZE");
  };
  count("--trainer-gpus", &f->trainer_gpus, "GPUs of the trainer");
  count("--rollout-gpus", &f->rollout_gpus, "GPUs of the rollouts");
  size("--model-bytes", &f->model_bytes, "the model's size");
  count("--tp", &f->tp, "GPUs per rollout instance (tensor parallel)");
  count("--tensors", &f->tensors,
        "tensors per shard (MoE-like: thousands of small ones; default 1)");
  size("--chunk-bytes", &f->chunk_bytes, "TensorHub's chunk");
  size("--segment-bytes", &f->segment_bytes,
       "the broadcast baselines' pipelining segment");
  size("--cut-through-bytes", &f->cut_through_bytes,
       "TensorHub's cut-through piece: a hop lags this, not a chunk (0: "
       "whole chunks, the data plane before cut-through)");
  real("--nic-gbit", &f->nic_gbit, "NIC rate per GPU, each direction");
  real("--nvlink-gbyte", &f->nvlink_gbyte,
       "NVLink rate per GPU inside a node, each direction");
  count("--gpus-per-node", &f->gpus_per_node, "GPUs per node");
  count("--nodes-per-rack", &f->nodes_per_rack, "nodes per rack");
  real("--rack-oversub", &f->rack_oversub,
       "rack uplink oversubscription (0: no rack limit)");
  c->add_flag("--no-rack-labels", f->no_rack_labels,
              "do not tell the hub the racks");
  c->add_flag("--hub-idle-first", f->hub_idle_first,
              "the hub ranks idle holders first even with oversubscribed "
              "racks (as a hub not told about them)");
  real("--wan-gbit", &f->wan_gbit, "the WAN between datacenters");
  real("--efficiency", &f->efficiency,
       "the share of a link's rate that carries payload");
  count("--rounds", &f->rounds, "versions published");
  real("--step-s", &f->step_s, "trainer compute between publishes");
  count("--max-sources", &f->max_sources, "FetchOptions::max_sources");
  count("--trainer-copies", &f->trainer_copies,
        "full reliable copies the trainer waits for before unpublishing");
  real("--spot-fraction", &f->spot_fraction,
       "share of rollout instances that are spot (join and leave)");
  real("--arrival-spread-s", &f->arrival_spread_s,
       "instances need the new version spread over [0, this] s");
  c->add_option("--seed", f->seed, "the seed of spot and arrival times");
}

}  // namespace tensorhub::cli
