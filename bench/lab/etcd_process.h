// A one-member etcd on loopback for the HA tests and `tensorhub-lab chaos
// --ha N`: Debian's etcd-server binary, free ports, a fresh data directory
// that goes away with it. Not for production (no TLS, no peers).
#ifndef TENSORHUB_BENCH_LAB_ETCD_PROCESS_H_
#define TENSORHUB_BENCH_LAB_ETCD_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>

#include "tensorhub/status.h"

namespace tensorhub::lab {

// The etcd binary ($TENSORHUB_ETCD, else `etcd` on PATH, else
// /usr/bin/etcd), or NOT_FOUND saying how to install it.
Result<std::string> FindEtcd();

class EtcdProcess {
 public:
  // Starts etcd and returns once it answers a read (within 30 s). etcd is
  // killed when the thread that started it exits (PR_SET_PDEATHSIG): start
  // it from one that outlives it (the main thread).
  static Result<std::unique_ptr<EtcdProcess>> Start();
  ~EtcdProcess();  // SIGKILL, reap, remove the data directory
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  // HOST:PORT of its client endpoint (what --etcd takes).
  const std::string& endpoint() const { return endpoint_; }
  pid_t pid() const { return pid_; }

 private:
  EtcdProcess() = default;
  pid_t pid_ = -1;
  std::string endpoint_;
  std::string dir_;
};

}  // namespace tensorhub::lab

#endif  // TENSORHUB_BENCH_LAB_ETCD_PROCESS_H_
