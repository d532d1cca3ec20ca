#include "sim/cluster.h"

#include <cassert>

namespace tensorhub::sim {
namespace {
// Link ids: per GPU 4 (NIC up, NIC down, NVLink up, NVLink down), then per
// rack 2 (up, down), then the wide-area link's two directions.
constexpr int32_t kNicUp = 0, kNicDown = 1, kNvUp = 2, kNvDown = 3;
}  // namespace

Status ClusterConfig::Validate() const {
  if (gpus_per_node < 1 || gpus_per_node > 1024) {
    return InvalidArgument("gpus per node must be in [1, 1024]");
  }
  if (nodes_per_rack < 1 || nodes_per_rack > 1 << 20) {
    return InvalidArgument("nodes per rack must be in [1, 2^20]");
  }
  if (!(nic_gbit > 0) || !(nvlink_gbyte > 0) || !(wan_gbit > 0)) {
    return InvalidArgument("link rates must be positive");
  }
  if (!(rack_oversub >= 0)) {
    return InvalidArgument("rack oversubscription must be >= 0 (0: none)");
  }
  if (!(efficiency > 0 && efficiency <= 1)) {
    return InvalidArgument("link efficiency must be in (0, 1]");
  }
  return Status::Ok();
}

Cluster::Cluster(const ClusterConfig& config, int gpus_dc0, int gpus_dc1)
    : config_(config) {
  nic_ = config.nic_gbit * 1e9 / 8 * config.efficiency;
  wan_ = config.wan_gbit * 1e9 / 8 * config.efficiency;
  const double nv = config.nvlink_gbyte * 1e9 * config.efficiency;
  int next_node = 0, next_rack = 0;
  for (int d = 0; d < 2; ++d) {
    int n = d == 0 ? gpus_dc0 : gpus_dc1;
    int first_node = next_node;
    for (int i = 0; i < n; ++i) {
      int node = first_node + i / config.gpus_per_node;
      dc_.push_back(d);
      node_.push_back(node);
      rack_.push_back(next_rack + (node - first_node) / config.nodes_per_rack);
    }
    if (n > 0) {
      next_node = node_.back() + 1;
      next_rack = rack_.back() + 1;
    }
  }
  const size_t gpus = dc_.size();
  capacity_.resize(gpus * 4);
  for (size_t g = 0; g < gpus; ++g) {
    capacity_[g * 4 + kNicUp] = nic_;
    capacity_[g * 4 + kNicDown] = nic_;
    capacity_[g * 4 + kNvUp] = nv;
    capacity_[g * 4 + kNvDown] = nv;
  }
  rack_link_base_ = static_cast<int32_t>(capacity_.size());
  const double rack_rate = config.rack_oversub > 0
                               ? nic_ * config.gpus_per_node *
                                     config.nodes_per_rack / config.rack_oversub
                               : 0;
  for (int r = 0; r < next_rack; ++r) {
    capacity_.push_back(rack_rate);
    capacity_.push_back(rack_rate);
  }
  wan_link_base_ = static_cast<int32_t>(capacity_.size());
  capacity_.push_back(wan_);  // dc0 -> dc1
  capacity_.push_back(wan_);  // dc1 -> dc0
}

FlowLinks Cluster::Path(int src, int dst) const {
  FlowLinks p;
  const int32_t s = src * 4, d = dst * 4;
  if (node(src) == node(dst)) {
    p.Add(s + kNvUp);
    p.Add(d + kNvDown);
    return p;
  }
  p.Add(s + kNicUp);
  p.Add(d + kNicDown);
  if (rack(src) != rack(dst) && config_.rack_oversub > 0) {
    p.Add(rack_link_base_ + 2 * rack(src));
    p.Add(rack_link_base_ + 2 * rack(dst) + 1);
  }
  if (dc(src) != dc(dst)) p.Add(wan_link_base_ + (dc(src) == 0 ? 0 : 1));
  return p;
}

std::string Cluster::DcLabel(int gpu) const {
  return "dc" + std::to_string(dc(gpu));
}
std::string Cluster::RackLabel(int gpu) const {
  return config_.rack_labels ? "r" + std::to_string(rack(gpu)) : "";
}
std::string Cluster::HostLabel(int gpu) const {
  return "n" + std::to_string(node(gpu));
}

}  // namespace tensorhub::sim
