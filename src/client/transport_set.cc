#include "client/transport_set.h"

#include <algorithm>
#include <utility>

#include "common/log.h"

namespace tensorhub::client {
namespace {

constexpr std::string_view kSchemeEnd = "://";

// The servers of one worker: TCP's at address(), the others listed by
// endpoints().
class ServerSet final : public transport::Server {
 public:
  ServerSet(std::unique_ptr<transport::Server> tcp,
            std::vector<std::unique_ptr<transport::Server>> others,
            std::vector<std::string> names)
      : tcp_(std::move(tcp)),
        others_(std::move(others)),
        names_(std::move(names)) {}
  ~ServerSet() override { Stop(); }

  std::string address() const override { return tcp_->address(); }
  void Stop() override {
    for (auto& s : others_) s->Stop();
    tcp_->Stop();
  }
  uint64_t bytes_served() const override {
    uint64_t n = tcp_->bytes_served();
    for (const auto& s : others_) n += s->bytes_served();
    return n;
  }
  uint64_t bytes_served_local() const override {
    uint64_t n = tcp_->bytes_served_local();
    for (const auto& s : others_) n += s->bytes_served_local();
    return n;
  }
  uint64_t bytes_served_staged() const override {
    uint64_t n = tcp_->bytes_served_staged();
    for (const auto& s : others_) n += s->bytes_served_staged();
    return n;
  }
  uint64_t connections_refused() const override {
    uint64_t n = tcp_->connections_refused();
    for (const auto& s : others_) n += s->connections_refused();
    return n;
  }
  uint64_t connections_tls() const override { return tcp_->connections_tls(); }
  uint64_t connections_kernel_tls() const override {
    return tcp_->connections_kernel_tls();
  }
  std::vector<DataEndpoint> endpoints() const override {
    std::vector<DataEndpoint> out;
    for (size_t i = 0; i < others_.size(); ++i) {
      out.push_back({names_[i], others_[i]->address()});
    }
    return out;
  }
  std::vector<std::pair<std::string, uint64_t>> bytes_sent_by_others()
      const override {
    std::vector<std::pair<std::string, uint64_t>> out;
    for (size_t i = 0; i < others_.size(); ++i) {
      const uint64_t all = others_[i]->bytes_served();
      out.emplace_back(names_[i],
                       all - std::min(all, others_[i]->bytes_served_local()));
    }
    return out;
  }

 private:
  std::unique_ptr<transport::Server> tcp_;
  std::vector<std::unique_ptr<transport::Server>> others_;
  std::vector<std::string> names_;
};

class TransportSet final : public transport::Transport {
 public:
  TransportSet(std::unique_ptr<transport::Transport> tcp,
               std::vector<std::unique_ptr<transport::Transport>> others)
      : tcp_(std::move(tcp)), others_(std::move(others)) {
    for (const auto& t : others_) name_ += std::string(t->name()) + ",";
    name_ += std::string(tcp_->name());
  }

  std::string_view name() const override { return name_; }

  // TCP on `host_port`; each other transport on the same host, port 0.
  Result<std::unique_ptr<transport::Server>> Listen(
      const std::string& host_port, transport::ReadSource* source,
      const transport::ServerOptions& options) override {
    TH_ASSIGN_OR_RETURN(std::unique_ptr<transport::Server> tcp,
                        tcp_->Listen(host_port, source, options));
    const std::string host = host_port.substr(0, host_port.rfind(':'));
    std::vector<std::unique_ptr<transport::Server>> others;
    std::vector<std::string> names;
    for (const auto& t : others_) {
      Result<std::unique_ptr<transport::Server>> s =
          t->Listen(host + ":0", source, options);
      if (!s.ok()) {
        tcp->Stop();
        for (auto& o : others) o->Stop();
        return s.status().WithContext(std::string(t->name()) +
                                      " data server on " + host);
      }
      others.push_back(std::move(s).value());
      names.emplace_back(t->name());
    }
    return std::unique_ptr<transport::Server>(std::make_unique<ServerSet>(
        std::move(tcp), std::move(others), std::move(names)));
  }

  Result<std::unique_ptr<transport::Connection>> Connect(
      const std::string& address, const Deadline& deadline) override {
    const std::string_view via = TransportOf(address);
    if (via == "tcp") return tcp_->Connect(address, deadline);
    for (const auto& t : others_) {
      if (t->name() == via) {
        return t->Connect(address.substr(via.size() + kSchemeEnd.size()),
                          deadline);
      }
    }
    return FailedPrecondition("no " + std::string(via) +
                              " transport here to dial " + address);
  }

 private:
  std::unique_ptr<transport::Transport> tcp_;
  std::vector<std::unique_ptr<transport::Transport>> others_;
  std::string name_;
};

}  // namespace

std::unique_ptr<transport::Transport> MakeTransportSet(
    std::unique_ptr<transport::Transport> tcp,
    std::vector<std::unique_ptr<transport::Transport>> others) {
  if (others.empty()) return tcp;
  return std::make_unique<TransportSet>(std::move(tcp), std::move(others));
}

std::string DialAddress(const std::vector<std::string>& preference,
                        const std::string& data_address,
                        const std::vector<DataEndpoint>& endpoints) {
  for (const std::string& want : preference) {
    if (want == "tcp") break;
    for (const DataEndpoint& e : endpoints) {
      if (e.transport == want) {
        return e.transport + std::string(kSchemeEnd) + e.address;
      }
    }
  }
  return data_address;
}

std::string_view TransportOf(std::string_view dial_address) {
  const size_t end = dial_address.find(kSchemeEnd);
  return end == std::string_view::npos ? std::string_view("tcp")
                                       : dial_address.substr(0, end);
}

}  // namespace tensorhub::client
