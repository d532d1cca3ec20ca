#include "node/node_protocol.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

namespace tensorhub::node {
namespace {

using Json = nlohmann::json;

constexpr uint64_t kAlignBytes = 64;
constexpr size_t kMaxModelBytes = 256;
constexpr size_t kMaxGroupBytes = 256;
constexpr int64_t kMaxTimeoutMs = 3600000;

const char* OpName(Op op) {
  switch (op) {
    case Op::kAcquire:
      return "acquire";
    case Op::kStage:
      return "stage";
    case Op::kRelease:
      return "release";
    case Op::kStatus:
      return "status";
  }
  return "status";
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Waits until `sock` is ready for `events`, the deadline passes (-1: none)
// or `stop_fd` is readable.
Status Wait(int sock, short events, int64_t deadline_ms, int stop_fd) {
  for (;;) {
    struct pollfd p[2] = {{sock, events, 0}, {stop_fd, POLLIN, 0}};
    int wait_ms = -1;
    if (deadline_ms >= 0) {
      const int64_t left = deadline_ms - NowMs();
      if (left <= 0) return DeadlineExceeded("node socket: timed out");
      wait_ms = static_cast<int>(std::min<int64_t>(left, 1 << 30));
    }
    const int n = poll(p, stop_fd >= 0 ? 2 : 1, wait_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Internal(std::string("node socket: poll: ") + strerror(errno));
    }
    if (n == 0) continue;  // the deadline is checked above
    if (stop_fd >= 0 && (p[1].revents & POLLIN)) {
      return Aborted("node socket: stopping");
    }
    if (p[0].revents != 0) return Status();
  }
}

Result<sockaddr_un> Address(std::string_view name, socklen_t* len) {
  TH_RETURN_IF_ERROR(CheckSocketName(name));
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (name[0] == '@') {
    // Abstract: a leading NUL, then the name without '@'; the length says
    // where it ends (no trailing NUL).
    std::memcpy(a.sun_path + 1, name.data() + 1, name.size() - 1);
    *len =
        static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  } else {
    std::memcpy(a.sun_path, name.data(), name.size());
    *len = static_cast<socklen_t>(sizeof(a));
  }
  return a;
}

Json TensorJson(const CopyTensor& t) {
  return Json::array(
      {t.name, std::string(DTypeName(t.dtype)), t.shape, t.offset, t.bytes});
}

bool IsUtf8(const std::string& s) {
  try {
    (void)Json(s).dump();
    return true;
  } catch (const Json::exception&) {
    return false;
  }
}

}  // namespace

Result<Request> ParseRequest(std::string_view text) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    return InvalidArgument("node request: not a JSON object");
  }
  Request r;
  auto op = j.find("op");
  if (op == j.end() || !op->is_string()) {
    return InvalidArgument("node request: no \"op\"");
  }
  const std::string& name = op->get_ref<const std::string&>();
  if (name == "acquire") {
    r.op = Op::kAcquire;
  } else if (name == "stage") {
    r.op = Op::kStage;
  } else if (name == "release") {
    r.op = Op::kRelease;
  } else if (name == "status") {
    r.op = Op::kStatus;
  } else {
    return InvalidArgument("node request: unknown op '" + name.substr(0, 64) +
                           "' (acquire, stage, release, status)");
  }
  if (r.op == Op::kAcquire || r.op == Op::kStage) {
    auto m = j.find("model");
    if (m == j.end() || !m->is_string() ||
        m->get_ref<const std::string&>().empty() ||
        m->get_ref<const std::string&>().size() > kMaxModelBytes) {
      return InvalidArgument(
          "node request: \"model\" must be a name of 1 to 256 bytes");
    }
    r.model = m->get<std::string>();
    auto v = j.find("version");
    if (v == j.end() ||
        (v->is_string() && v->get_ref<const std::string&>() == "latest")) {
      r.version = Version::Latest();
    } else if (v->is_number_unsigned() && v->get<uint64_t>() >= 1) {
      r.version = Version(v->get<uint64_t>());
    } else {
      return InvalidArgument(
          "node request: \"version\" must be an integer >= 1 or \"latest\"");
    }
    auto g = j.find("group");
    if (g != j.end() && !g->is_null()) {
      if (!g->is_string() ||
          g->get_ref<const std::string&>().size() > kMaxGroupBytes) {
        return InvalidArgument(
            "node request: \"group\" must be a string of at most 256 bytes");
      }
      r.group = g->get<std::string>();
    }
    auto s = j.find("step");
    if (s != j.end() && !s->is_null()) {
      if (!s->is_number_unsigned()) {
        return InvalidArgument(
            "node request: \"step\" must be an integer >= 0");
      }
      r.step = s->get<uint64_t>();
    }
    auto t = j.find("timeout_ms");
    if (t != j.end() && !t->is_null()) {
      if (!t->is_number_unsigned() || t->get<uint64_t>() < 1 ||
          t->get<uint64_t>() > static_cast<uint64_t>(kMaxTimeoutMs)) {
        return InvalidArgument(
            "node request: \"timeout_ms\" must be an integer in [1, 3600000]");
      }
      r.timeout_ms = static_cast<int64_t>(t->get<uint64_t>());
    }
  }
  return r;
}

std::string EncodeRequest(const Request& r) {
  Json j{{"op", OpName(r.op)}};
  if (r.op == Op::kAcquire || r.op == Op::kStage) {
    j["model"] = r.model;
    if (r.version.is_latest()) {
      j["version"] = "latest";
    } else {
      j["version"] = r.version.value();
    }
    if (!r.group.empty()) {
      j["group"] = r.group;
      j["step"] = r.step;
    }
    j["timeout_ms"] = r.timeout_ms;
  }
  return j.dump();
}

uint64_t LayOut(std::vector<CopyTensor>& tensors) {
  uint64_t at = 0;
  for (CopyTensor& t : tensors) {
    at = (at + kAlignBytes - 1) / kAlignBytes * kAlignBytes;
    t.offset = at;
    at += t.bytes;
  }
  return at;
}

std::string EncodeAcquireReply(const AcquireReply& r) {
  Json tensors = Json::array();
  for (const CopyTensor& t : r.tensors) tensors.push_back(TensorJson(t));
  Json metadata = Json::array();
  Json binary = Json::array();
  for (const auto& [k, v] : r.metadata) {
    if (IsUtf8(k) && IsUtf8(v)) {
      metadata.push_back(Json::array({k, v}));
    } else if (IsUtf8(k)) {
      binary.push_back(k);
    }
  }
  for (const std::string& k : r.binary_metadata_keys) {
    if (IsUtf8(k)) binary.push_back(k);
  }
  Json j{{"ok", true},
         {"protocol", kProtocolVersion},
         {"model", r.model},
         {"version", r.version.value()},
         {"bytes", r.bytes},
         {"holder", r.holder},
         {"fetched_now", r.fetched_now},
         {"tensors", tensors},
         {"metadata", metadata},
         {"binary_metadata_keys", binary}};
  return j.dump();
}

Result<AcquireReply> ParseAcquireReply(std::string_view text) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.value("ok", false)) {
    return InvalidArgument("node reply: not an acquire reply: " +
                           std::string(text.substr(0, 200)));
  }
  try {
    AcquireReply r;
    r.model = j.at("model").get<std::string>();
    r.version = Version(j.at("version").get<uint64_t>());
    r.bytes = j.at("bytes").get<uint64_t>();
    r.holder = j.value("holder", "");
    r.fetched_now = j.value("fetched_now", false);
    for (const Json& t : j.at("tensors")) {
      CopyTensor c;
      c.name = t.at(0).get<std::string>();
      TH_ASSIGN_OR_RETURN(c.dtype, ParseDType(t.at(1).get<std::string>()));
      c.shape = t.at(2).get<std::vector<uint64_t>>();
      c.offset = t.at(3).get<uint64_t>();
      c.bytes = t.at(4).get<uint64_t>();
      r.tensors.push_back(std::move(c));
    }
    for (const Json& m : j.at("metadata")) {
      r.metadata.emplace_back(m.at(0).get<std::string>(),
                              m.at(1).get<std::string>());
    }
    return r;
  } catch (const Json::exception& e) {
    return InvalidArgument(std::string("node reply: ") + e.what());
  }
}

std::string EncodeOk(std::string_view fields_json) {
  Json j = Json::parse(fields_json, nullptr, false);
  if (!j.is_object()) j = Json::object();
  j["ok"] = true;
  j["protocol"] = kProtocolVersion;
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string EncodeError(const Status& s, bool fallback) {
  Json j{{"ok", false},
         {"protocol", kProtocolVersion},
         {"code", std::string(StatusCodeName(s.code()))},
         {"message", s.message()},
         {"fallback", fallback}};
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

Status CheckSocketName(std::string_view name) {
  if (name.empty() || name == "@") {
    return InvalidArgument("node socket: empty name");
  }
  if (name.size() > sizeof(sockaddr_un{}.sun_path) - 1) {
    return InvalidArgument("node socket: '" + std::string(name) +
                           "' is longer than 107 bytes");
  }
  if (name.find('\0') != std::string_view::npos) {
    return InvalidArgument("node socket: name holds a NUL byte");
  }
  return Status();
}

Result<int> Listen(std::string_view name, int backlog) {
  socklen_t len = 0;
  TH_ASSIGN_OR_RETURN(sockaddr_un a, Address(name, &len));
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Internal(std::string("node socket: ") + strerror(errno));
  const bool path = name[0] != '@';
  if (path) {
    // A file left by an agent that died is replaced; one that answers is
    // another agent's, and left alone.
    Result<int> other = Connect(name, 1000);
    if (other.ok()) {
      close(*other);
      close(fd);
      return FailedPrecondition("node socket: an agent already listens at " +
                                std::string(name));
    }
    unlink(std::string(name).c_str());
  }
  const mode_t old_mask = path ? umask(0177) : 0;
  const int rc = bind(fd, reinterpret_cast<sockaddr*>(&a), len);
  const int bind_errno = errno;
  if (path) umask(old_mask);
  if (rc != 0) {
    close(fd);
    if (bind_errno == EADDRINUSE) {
      return FailedPrecondition("node socket: an agent already listens at " +
                                std::string(name));
    }
    return Unavailable("node socket: bind " + std::string(name) + ": " +
                       strerror(bind_errno));
  }
  if (listen(fd, backlog) != 0) {
    const int e = errno;
    close(fd);
    return Internal("node socket: listen: " + std::string(strerror(e)));
  }
  return fd;
}

Result<int> Connect(std::string_view name, int64_t timeout_ms) {
  socklen_t len = 0;
  TH_ASSIGN_OR_RETURN(sockaddr_un a, Address(name, &len));
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Internal(std::string("node socket: ") + strerror(errno));
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), len) != 0) {
    if (errno != EINPROGRESS && errno != EAGAIN) {
      const int e = errno;
      close(fd);
      return Unavailable("no node agent at " + std::string(name) + ": " +
                         strerror(e));
    }
    Status w = Wait(fd, POLLOUT, NowMs() + timeout_ms, -1);
    int err = 0;
    socklen_t elen = sizeof(err);
    if (w.ok()) getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen);
    if (!w.ok() || err != 0) {
      close(fd);
      return Unavailable("no node agent at " + std::string(name) + ": " +
                         (w.ok() ? strerror(err) : w.message()));
    }
  }
  return fd;
}

Status SendMessage(int sock, std::string_view json, int pass_fd,
                   int64_t timeout_ms) {
  if (json.size() > kMaxReplyBytes) {
    return ResourceExhausted("node message of " + std::to_string(json.size()) +
                             " bytes is over the limit");
  }
  const uint32_t n = static_cast<uint32_t>(json.size());
  unsigned char header[4] = {
      static_cast<unsigned char>(n), static_cast<unsigned char>(n >> 8),
      static_cast<unsigned char>(n >> 16), static_cast<unsigned char>(n >> 24)};
  const int64_t deadline = timeout_ms < 0 ? -1 : NowMs() + timeout_ms;
  size_t sent = 0;
  const size_t total = 4 + json.size();
  bool fd_sent = pass_fd < 0;
  while (sent < total) {
    iovec iov[2];
    int niov = 0;
    if (sent < 4) {
      iov[niov++] = {header + sent, 4 - sent};
      iov[niov++] = {const_cast<char*>(json.data()), json.size()};
    } else {
      iov[niov++] = {const_cast<char*>(json.data()) + (sent - 4),
                     json.size() - (sent - 4)};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = niov;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    if (!fd_sent) {
      std::memset(control, 0, sizeof(control));
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
    }
    const ssize_t w = sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        TH_RETURN_IF_ERROR(Wait(sock, POLLOUT, deadline, -1));
        continue;
      }
      return Unavailable(std::string("node socket: send: ") + strerror(errno));
    }
    fd_sent = true;
    sent += static_cast<size_t>(w);
  }
  return Status();
}

Result<std::string> ReceiveMessage(int sock, uint32_t max_bytes,
                                   int64_t timeout_ms, int stop_fd,
                                   int* received_fd) {
  if (received_fd != nullptr) *received_fd = -1;
  const int64_t deadline = timeout_ms < 0 ? -1 : NowMs() + timeout_ms;
  unsigned char header[4];
  std::string body;
  size_t got = 0;
  size_t want = 4;
  for (;;) {
    TH_RETURN_IF_ERROR(Wait(sock, POLLIN, deadline, stop_fd));
    iovec iov;
    if (got < 4) {
      iov = {header + got, 4 - got};
    } else {
      iov = {body.data() + (got - 4), want - got};
    }
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t r = recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return Unavailable(std::string("node socket: receive: ") +
                         strerror(errno));
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr;
         c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        int fd = -1;
        std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
        if (received_fd != nullptr && *received_fd < 0) {
          *received_fd = fd;
        } else {
          close(fd);
        }
      }
    }
    if (r == 0) {
      if (received_fd != nullptr && *received_fd >= 0) {
        close(*received_fd);
        *received_fd = -1;
      }
      return got == 0 ? Unavailable("node socket: closed")
                      : Unavailable("node socket: closed mid-message");
    }
    got += static_cast<size_t>(r);
    if (got == 4) {
      const uint32_t n = header[0] | (header[1] << 8) | (header[2] << 16) |
                         (static_cast<uint32_t>(header[3]) << 24);
      if (n > max_bytes) {
        if (received_fd != nullptr && *received_fd >= 0) {
          close(*received_fd);
          *received_fd = -1;
        }
        return InvalidArgument("node socket: a message of " +
                               std::to_string(n) + " bytes (at most " +
                               std::to_string(max_bytes) + ")");
      }
      body.resize(n);
      want = 4 + n;
    }
    if (got >= 4 && got == want) return body;
  }
}

}  // namespace tensorhub::node
