#include "hub/connection_guard.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/deadline.h"

namespace tensorhub::hub {
namespace {

std::function<void(int fd)> t_before_shutdown_for_test;

// The address of a socket's local end (`local`) or peer, without the
// port; false if it has none (a listener has no peer) or is not IP.
bool EndAddress(int fd, bool local, std::string* host, int* port) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  auto* sa = reinterpret_cast<sockaddr*>(&ss);
  if ((local ? ::getsockname(fd, sa, &len) : ::getpeername(fd, sa, &len)) !=
      0) {
    return false;
  }
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
    *port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
    *port = ntohs(a->sin6_port);
  } else {
    return false;
  }
  *host = buf;
  return true;
}

// The inode of a socket descriptor ("socket:[123]"), 0 for anything else.
uint64_t SocketInode(int fd) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  char link[64] = {0};
  const ssize_t n = ::readlink(path, link, sizeof(link) - 1);
  if (n <= 8 || std::strncmp(link, "socket:[", 8) != 0) return 0;
  return std::strtoull(link + 8, nullptr, 10);
}

bool StillSocket(int fd, uint64_t inode) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) &&
         static_cast<uint64_t>(st.st_ino) == inode;
}

// Shuts down the socket `inode` that descriptor `fd` named when a pass saw
// it. The check and the shutdown act on a duplicate of the descriptor,
// which refers to the socket the check found whatever the number `fd` names
// by then: a socket of its owner's that was closed and whose number was
// reused in between (a hub embedded beside clients) is never the one shut
// down. False if `fd` no longer names that socket.
bool ShutDown(int fd, uint64_t inode) {
  const int mine = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (mine < 0) return false;
  const bool same = StillSocket(mine, inode);
  if (same) {
    if (t_before_shutdown_for_test) t_before_shutdown_for_test(fd);
    ::shutdown(mine, SHUT_RDWR);
  }
  ::close(mine);
  return same;
}

bool Newer(const GuardedConnection* a, const GuardedConnection* b) {
  if (a->first_seen_ms != b->first_seen_ms) {
    return a->first_seen_ms > b->first_seen_ms;
  }
  return a->id > b->id;
}

}  // namespace

std::vector<uint64_t> ConnectionsOverLimits(
    const std::vector<GuardedConnection>& conns,
    const ConnectionLimits& limits) {
  std::map<std::string, std::vector<const GuardedConnection*>> by_peer;
  for (const GuardedConnection& c : conns) by_peer[c.peer].push_back(&c);
  std::vector<uint64_t> close;
  std::vector<const GuardedConnection*> kept;
  for (auto& [peer, list] : by_peer) {
    std::sort(list.begin(), list.end(), Newer);
    const size_t excess = list.size() > limits.max_per_peer
                              ? list.size() - limits.max_per_peer
                              : 0;
    for (size_t i = 0; i < list.size(); ++i) {
      if (i < excess) {
        close.push_back(list[i]->id);
      } else {
        kept.push_back(list[i]);
      }
    }
  }
  if (kept.size() > limits.max_connections) {
    std::sort(kept.begin(), kept.end(), Newer);
    for (size_t i = 0; i < kept.size() - limits.max_connections; ++i) {
      close.push_back(kept[i]->id);
    }
  }
  return close;
}

ConnectionGuard::ConnectionGuard(int port, ConnectionLimits limits)
    : port_(port), limits_(limits), log_("hub") {}

void ConnectionGuard::Start(int64_t period_ms) {
  thread_ = std::thread([this, period_ms] {
    MutexLock lock(mu_);
    while (!stopping_) {
      cv_.wait_for(lock.native(), std::chrono::milliseconds(period_ms));
      if (stopping_) break;
      lock.Unlock();
      (void)Pass();
      lock.Lock();
    }
  });
}

void ConnectionGuard::Stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

size_t ConnectionGuard::Pass() {
  MutexLock pass(pass_mu_);
  const int64_t now_ms = NowMs();
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  const int dir_fd = ::dirfd(dir);
  std::set<uint64_t> present;
  std::vector<Seen> fresh;
  size_t descriptors = 0;
  {
    std::set<uint64_t> known;
    {
      MutexLock lock(mu_);
      for (const auto& [id, s] : known_) known.insert(id);
      known.insert(ignored_.begin(), ignored_.end());
    }
    while (dirent* e = ::readdir(dir)) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      const int fd = std::atoi(e->d_name);
      if (fd == dir_fd) continue;
      ++descriptors;
      const uint64_t inode = SocketInode(fd);
      if (inode == 0) continue;
      present.insert(inode);
      if (known.count(inode) > 0) continue;
      Seen s;
      s.fd = fd;
      s.conn.id = inode;
      s.conn.first_seen_ms = now_ms;
      // Looked at through a duplicate, which names the socket the readlink
      // found (or none) even if its owner closes the number meanwhile.
      const int mine = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
      if (mine < 0) continue;
      std::string local;
      int local_port = 0, peer_port = 0;
      const bool same = StillSocket(mine, inode);
      const bool ours =
          same && EndAddress(mine, /*local=*/true, &local, &local_port) &&
          local_port == port_ &&
          EndAddress(mine, /*local=*/false, &s.conn.peer, &peer_port);
      ::close(mine);
      if (!same) continue;
      if (!ours) s.fd = -1;  // looked at once, ignored afterwards
      fresh.push_back(std::move(s));
    }
  }
  ::closedir(dir);
  MutexLock lock(mu_);
  for (Seen& s : fresh) {
    if (s.fd < 0) {
      ignored_.insert(s.conn.id);
    } else {
      known_.emplace(s.conn.id, std::move(s));
    }
  }
  for (auto it = known_.begin(); it != known_.end();) {
    it = present.count(it->first) > 0 ? std::next(it) : known_.erase(it);
  }
  for (auto it = ignored_.begin(); it != ignored_.end();) {
    it = present.count(*it) > 0 ? std::next(it) : ignored_.erase(it);
  }
  std::vector<GuardedConnection> conns;
  conns.reserve(known_.size());
  std::map<std::string, size_t> per_peer;
  for (const auto& [id, s] : known_) {
    conns.push_back(s.conn);
    ++per_peer[s.conn.peer];
  }
  size_t closed = 0;
  for (uint64_t id : ConnectionsOverLimits(conns, limits_)) {
    auto it = known_.find(id);
    if (it == known_.end() || !ShutDown(it->second.fd, id)) continue;
    ++closed;
    const std::string& peer = it->second.conn.peer;
    const bool over_peer = per_peer[peer] > limits_.max_per_peer;
    if (over_peer) {
      ++stats_.closed_over_peer;
    } else {
      ++stats_.closed_over_total;
    }
    log_.Refused(peer, over_peer ? "closed a connection: more than " +
                                       std::to_string(limits_.max_per_peer) +
                                       " open from this address "
                                       "(max_connections_per_peer)"
                                 : "closed a connection: more than " +
                                       std::to_string(limits_.max_connections) +
                                       " open in all (max_connections)");
    // Until its owner closes it, it is no longer counted.
    ignored_.insert(id);
    known_.erase(it);
  }
  stats_.open = known_.size();
  per_peer.clear();
  for (const auto& [id, s] : known_) ++per_peer[s.conn.peer];
  stats_.peers = per_peer.size();
  stats_.descriptors = descriptors;
  return closed;
}

void ConnectionGuard::SetBeforeShutdownForTest(std::function<void(int fd)> f) {
  t_before_shutdown_for_test = std::move(f);
}

ConnectionGuard::Stats ConnectionGuard::stats() const {
  MutexLock lock(mu_);
  return stats_;
}

}  // namespace tensorhub::hub
