// The simulated cluster: GPUs in nodes, nodes in racks, racks in up to two
// datacenters joined by a wide-area link; every link a capacity in bytes/s.
#ifndef TENSORHUB_SIM_CLUSTER_H_
#define TENSORHUB_SIM_CLUSTER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "sim/maxmin.h"
#include "tensorhub/status.h"

namespace tensorhub::sim {

struct ClusterConfig {
  int gpus_per_node = 8;
  int nodes_per_rack = 4;
  double nic_gbit = 400;      // per GPU, each direction
  double nvlink_gbyte = 450;  // per GPU, each direction, inside a node
  // Rack uplink = (GPUs in the rack x NIC) / oversubscription, each
  // direction. 0: no rack link (a non-blocking fabric).
  double rack_oversub = 1.0;
  double wan_gbit = 100;  // between the two datacenters, each direction
  // Payload share of a link's rate (framing); 1 for the cluster model, the
  // measured 0.956 for the tbf-shaped test bed.
  double efficiency = 1.0;
  // Tell the hub each GPU's rack (its scheduler prefers same-rack holders).
  bool rack_labels = true;

  Status Validate() const;
};

class Cluster {
 public:
  // GPUs [0, gpus_dc0) sit in datacenter 0, the next gpus_dc1 in
  // datacenter 1. Nodes and racks never straddle datacenters.
  Cluster(const ClusterConfig& config, int gpus_dc0, int gpus_dc1);

  int num_gpus() const { return static_cast<int>(dc_.size()); }
  int dc(int gpu) const { return dc_[static_cast<size_t>(gpu)]; }
  int node(int gpu) const { return node_[static_cast<size_t>(gpu)]; }
  int rack(int gpu) const { return rack_[static_cast<size_t>(gpu)]; }
  double nic_bytes_per_s() const { return nic_; }
  double wan_bytes_per_s() const { return wan_; }
  const std::vector<double>& capacity() const { return capacity_; }
  // The links a flow from `src` to `dst` crosses.
  FlowLinks Path(int src, int dst) const;
  // Labels for the hub: datacenter, rack and host ("dc0", "dc0-r3", "n17").
  std::string DcLabel(int gpu) const;
  std::string RackLabel(int gpu) const;
  std::string HostLabel(int gpu) const;

 private:
  ClusterConfig config_;
  double nic_ = 0;
  double wan_ = 0;
  std::vector<int> dc_, node_, rack_;
  std::vector<double> capacity_;
  int32_t rack_link_base_ = 0;
  int32_t wan_link_base_ = 0;
};

}  // namespace tensorhub::sim

#endif  // TENSORHUB_SIM_CLUSTER_H_
