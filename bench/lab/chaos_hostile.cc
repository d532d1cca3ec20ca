#include "chaos_hostile.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <random>
#include <thread>
#include <vector>

#include "common/deadline.h"
#include "tensorhub.grpc.pb.h"
#include "transport/tcp/socket_util.h"
#include "wire/call_proof.h"
#include "wire/frame.h"

namespace tensorhub::cli {
namespace {

struct Counts {
  std::atomic<uint64_t> idle{0}, reopened{0}, garbage{0}, tries{0}, refused{0},
      served{0}, unanswered{0};
};

// A TCP connection to `ip:port` from `from` (may be empty), within 1 s;
// -1 if none.
int Open(const std::string& ip, uint16_t port, const std::string& from) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  if (!from.empty()) {
    sockaddr_in src{};
    src.sin_family = AF_INET;
    ::inet_pton(AF_INET, from.c_str(), &src.sin_addr);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof(src)) != 0) {
      ::close(fd);
      return -1;
    }
  }
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(port);
  ::inet_pton(AF_INET, ip.c_str(), &dst.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof(dst)) != 0 &&
      errno != EINPROGRESS) {
    ::close(fd);
    return -1;
  }
  pollfd p{fd, POLLOUT, 0};
  int err = 0;
  socklen_t len = sizeof(err);
  if (::poll(&p, 1, 1000) != 1 ||
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Whether the other end closed `fd` (reads and drops what it sent).
bool ClosedByPeer(int fd) {
  char buf[4096];
  while (true) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK;
  }
}

void SendAll(int fd, const void* p, size_t n) {
  iovec v{const_cast<void*>(p), n};
  (void)transport::WriteAll(fd, {&v, 1}, Deadline::AfterMs(1000));
}

// Keeps `n` connections open (reopening those the target closes) until
// `stop`, each first sending `hello` (may be empty).
void HoldIdle(const std::string& ip, uint16_t port, const std::string& from,
              int n, const std::string& hello, const std::atomic<bool>& stop,
              Counts& c) {
  std::vector<int> fds(n, -1);
  // At most this many new connections per turn (10 ms): a target that
  // closes them at once is not turned into a busy loop of accepts.
  constexpr int kOpensPerTurn = 20;
  while (!stop.load()) {
    int opened = 0;
    for (int i = 0; i < n && !stop.load(); ++i) {
      if (fds[i] >= 0 && ClosedByPeer(fds[i])) {
        ::close(fds[i]);
        fds[i] = -1;
        ++c.reopened;
      }
      if (fds[i] < 0 && opened++ < kOpensPerTurn) {
        fds[i] = Open(ip, port, from);
        if (fds[i] >= 0) {
          ++c.idle;
          if (!hello.empty()) SendAll(fds[i], hello.data(), hello.size());
        }
      }
    }
    // Paced: the point is to hold slots, not to take the machine's cores.
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (int fd : fds) {
    if (fd >= 0) ::close(fd);
  }
}

// Connections that send `bytes` of garbage and leave, until `stop`.
void SendGarbage(const std::string& ip, uint16_t port, const std::string& from,
                 uint64_t seed, const std::atomic<bool>& stop, Counts& c) {
  std::mt19937_64 rng(seed);
  std::string junk(64 << 10, '\0');
  while (!stop.load()) {
    for (char& ch : junk) ch = static_cast<char>(rng());
    int fd = Open(ip, port, from);
    if (fd >= 0) {
      SendAll(fd, junk.data(), junk.size());
      ::close(fd);
      ++c.garbage;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Calls without a valid proof; each must be refused (PERMISSION_DENIED).
void CallWithoutTheSecret(const std::string& target, uint64_t seed,
                          const std::atomic<bool>& stop, Counts& c) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(64 << 20);
  auto stub = v1::Hub::NewStub(grpc::CreateCustomChannel(
      target, grpc::InsecureChannelCredentials(), args));
  std::mt19937_64 rng(seed);
  auto judge = [&c](const grpc::Status& s) {
    ++c.tries;
    if (s.ok()) {
      ++c.served;
    } else if (s.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
      ++c.refused;
    } else {
      ++c.unanswered;  // the hub down (restarting), stopped, a timeout
    }
  };
  auto deadline = [] {
    return std::chrono::system_clock::now() + std::chrono::seconds(3);
  };
  for (uint64_t i = 0; !stop.load(); ++i) {
    if (i % 4 == 0) {
      // Oversized: 32 MiB the hub must not read.
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline());
      v1::PublishRequest req;
      req.set_model(std::string(32 << 20, 'x'));
      req.set_secret("not the secret");
      v1::PublishResponse resp;
      judge(stub->Publish(&ctx, req, &resp));
      continue;
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    if (i % 4 == 1) {
      ctx.AddMetadata(wire::kCallProofKey,
                      wire::MakeCallProof("not the secret", wire::UnixNowMs()));
    } else if (i % 4 == 2) {
      std::string junk(40, 'a');
      for (char& ch : junk) ch = static_cast<char>('a' + rng() % 26);
      ctx.AddMetadata(wire::kCallProofKey, "v1." + junk);
    }
    v1::ListModelsRequest req;
    v1::ListModelsResponse resp;
    judge(stub->ListModels(&ctx, req, &resp));
  }
}

// Handshakes answered with a wrong proof; each must get a refusal.
void BadHandshakes(const std::string& ip, uint16_t port,
                   const std::string& from, uint64_t seed,
                   const std::atomic<bool>& stop, Counts& c) {
  std::mt19937_64 rng(seed);
  while (!stop.load()) {
    int fd = Open(ip, port, from);
    if (fd < 0) {
      ++c.unanswered;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    ++c.tries;
    const Deadline d = Deadline::AfterMs(2000);
    uint8_t challenge[wire::kChallengeBytes];
    uint8_t verdict[wire::kVerdictBytes];
    wire::Mac mac;
    for (uint8_t& b : mac) b = static_cast<uint8_t>(rng());
    auto proof = wire::EncodeProof(mac);
    bool answered =
        transport::ReadExact(fd, challenge, sizeof(challenge), d).ok();
    if (answered) SendAll(fd, proof.data(), proof.size());
    answered =
        answered && transport::ReadExact(fd, verdict, sizeof(verdict), d).ok();
    Result<StatusCode> v = answered
                               ? wire::DecodeVerdict(verdict, sizeof(verdict))
                               : Result<StatusCode>(Unavailable("none"));
    if (v.ok() && *v == StatusCode::kOk) {
      ++c.served;
    } else if (v.ok()) {
      ++c.refused;
    } else {
      ++c.unanswered;  // closed first (evicted, refused at accept)
    }
    ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace

int RunChaosAttacker(const AttackerFlags& f) {
  ::signal(SIGPIPE, SIG_IGN);
  auto hp = transport::SplitHostPort(f.target);
  if (!hp.ok()) return Fail(hp.status());
  const std::string ip = hp->first;
  const uint16_t port = hp->second;
  Counts c;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  static const std::string kPreface =
      std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") +
      std::string("\x00\x00\x00\x04\x00\x00\x00\x00\x00", 9);
  const bool hub = f.kind == "hub";
  threads.emplace_back([&] { SendGarbage(ip, port, f.from, f.seed, stop, c); });
  if (hub) {
    threads.emplace_back(
        [&] { HoldIdle(ip, port, f.from, f.connections, kPreface, stop, c); });
    threads.emplace_back(
        [&] { CallWithoutTheSecret(f.target, f.seed + 1, stop, c); });
    std::this_thread::sleep_for(std::chrono::milliseconds(f.ms));
  } else {
    // Idle connections first, then wrong proofs: a holder gives one
    // address only a few authenticating slots, which the idle ones would
    // otherwise hold all along.
    std::atomic<bool> idle_stop{false};
    std::thread idle(
        [&] { HoldIdle(ip, port, f.from, f.connections, "", idle_stop, c); });
    std::this_thread::sleep_for(std::chrono::milliseconds(f.ms / 2));
    idle_stop = true;
    idle.join();
    threads.emplace_back(
        [&] { BadHandshakes(ip, port, f.from, f.seed + 1, stop, c); });
    std::this_thread::sleep_for(std::chrono::milliseconds(f.ms - f.ms / 2));
  }
  stop = true;
  for (std::thread& t : threads) t.join();
  Reply("attacked " + f.kind + " idle=" + std::to_string(c.idle.load()) +
        " reopened=" + std::to_string(c.reopened.load()) +
        " garbage=" + std::to_string(c.garbage.load()) +
        " tries=" + std::to_string(c.tries.load()) +
        " refused=" + std::to_string(c.refused.load()) +
        " served=" + std::to_string(c.served.load()) +
        " unanswered=" + std::to_string(c.unanswered.load()));
  return 0;
}

void AddAttackerCommand(CommandLine& cl) {
  auto f = std::make_shared<AttackerFlags>();
  CLI::App* c = cl.Add("_chaos-attacker",
                       "a hostile peer of chaos (no secret) attacking a port",
                       [f] { return RunChaosAttacker(*f); });
  c->add_option("--target", f->target)->required();
  c->add_option("--kind", f->kind)->check(CLI::IsMember({"hub", "data"}));
  c->add_option("--ms", f->ms);
  c->add_option("--connections", f->connections);
  c->add_option("--from", f->from);
  c->add_option("--seed", f->seed);
}

}  // namespace tensorhub::cli
