#include "common/test_point.h"

#include <map>
#include <memory>
#include <mutex>

namespace tensorhub::testpoint {
namespace {

std::mutex& Mu() {
  static std::mutex mu;
  return mu;
}

// Actions are shared so that Fire can run one outside the lock while another
// thread disarms or replaces it.
std::map<std::string, std::shared_ptr<const Action>>& Points() {
  static auto* points =
      new std::map<std::string, std::shared_ptr<const Action>>();
  return *points;
}

}  // namespace

namespace internal {
std::atomic<int> armed_points{0};

void Fire(const char* name, uint64_t arg) {
  std::shared_ptr<const Action> action;
  {
    std::lock_guard<std::mutex> l(Mu());
    auto it = Points().find(name);
    if (it == Points().end()) return;
    action = it->second;
  }
  (*action)(arg);
}
}  // namespace internal

void Arm(const std::string& name, Action action) {
  std::lock_guard<std::mutex> l(Mu());
  Points()[name] = std::make_shared<const Action>(std::move(action));
  internal::armed_points.store(static_cast<int>(Points().size()),
                               std::memory_order_relaxed);
}

void Disarm(const std::string& name) {
  std::lock_guard<std::mutex> l(Mu());
  Points().erase(name);
  internal::armed_points.store(static_cast<int>(Points().size()),
                               std::memory_order_relaxed);
}

}  // namespace tensorhub::testpoint
