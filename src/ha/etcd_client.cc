#include "ha/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>

#include "common/mutex.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "wire/proto_convert.h"

namespace tensorhub::ha {
namespace {

namespace pb = ::etcdserverpb;

constexpr size_t kMaxEndpoints = 16;

// One etcd member: a channel and the stubs of the services we use.
struct Member {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::KV::Stub> kv;
  std::unique_ptr<pb::Lease::Stub> lease;
  std::unique_ptr<pb::Watch::Stub> watch;
};

// Every call waits for its member's channel to connect, within its
// deadline: gRPC fails a call at once while a channel is in
// TRANSIENT_FAILURE, and a reconnection completes only while a call polls
// the channel, so a member that came back (etcd restarted, or started after
// us) would stay unreachable to calls that fail fast.
void SetDeadline(grpc::ClientContext& ctx, const Deadline& d) {
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(d.remaining_ms()));
  ctx.set_wait_for_ready(true);
}

KeyValue FromPb(const mvccpb::KeyValue& kv) {
  return {kv.key(), kv.value(), kv.create_revision(), kv.mod_revision(),
          kv.lease()};
}

void ToPb(const Compare& c, pb::Compare* out) {
  out->set_key(c.key);
  switch (c.op) {
    case Compare::Op::kEqual:
      out->set_result(pb::Compare::EQUAL);
      break;
    case Compare::Op::kNotEqual:
      out->set_result(pb::Compare::NOT_EQUAL);
      break;
    case Compare::Op::kGreater:
      out->set_result(pb::Compare::GREATER);
      break;
    case Compare::Op::kLess:
      out->set_result(pb::Compare::LESS);
      break;
  }
  switch (c.target) {
    case Compare::Target::kCreateRevision:
      out->set_target(pb::Compare::CREATE);
      out->set_create_revision(c.number);
      break;
    case Compare::Target::kModRevision:
      out->set_target(pb::Compare::MOD);
      out->set_mod_revision(c.number);
      break;
    case Compare::Target::kValue:
      out->set_target(pb::Compare::VALUE);
      out->set_value(c.value);
      break;
    case Compare::Target::kLease:
      out->set_target(pb::Compare::LEASE);
      out->set_lease(c.number);
      break;
  }
}

void ToPb(const TxnOp& op, pb::RequestOp* out) {
  switch (op.kind) {
    case TxnOp::Kind::kPut: {
      pb::PutRequest* p = out->mutable_request_put();
      p->set_key(op.key);
      p->set_value(op.value);
      p->set_lease(op.lease);
      break;
    }
    case TxnOp::Kind::kDelete:
      out->mutable_request_delete_range()->set_key(op.key);
      break;
    case TxnOp::Kind::kGet:
      out->mutable_request_range()->set_key(op.key);
      break;
  }
}

}  // namespace

struct EtcdClient::Impl {
  std::string endpoints;
  std::vector<Member> members;
  // The member that answered last: calls start there.
  std::atomic<size_t> current{0};

  Mutex mu;
  grpc::ClientContext* waiting TH_GUARDED_BY(mu) = nullptr;
  bool cancelled TH_GUARDED_BY(mu) = false;

  // Runs `call(member, ctx)` on the current member, and on the next ones
  // while a member cannot be reached, within the deadline.
  template <typename Call>
  Status Invoke(const Deadline& deadline, const char* what, Call call) {
    const size_t n = members.size();
    const size_t first = current.load(std::memory_order_relaxed);
    grpc::Status last;
    size_t tried = first;
    for (size_t i = 0; i < n; ++i) {
      if (i > 0 && deadline.expired()) break;
      tried = (first + i) % n;
      grpc::ClientContext ctx;
      // A member that is down holds a call (waiting for it) until its
      // deadline: each member left gets an equal share of the time.
      SetDeadline(ctx, i + 1 == n ? deadline
                                  : deadline.Cap(deadline.remaining_ms() /
                                                 static_cast<int64_t>(n - i)));
      last = call(members[tried], ctx);
      if (last.ok()) {
        current.store(tried, std::memory_order_relaxed);
        return Status::Ok();
      }
      if (last.error_code() != grpc::StatusCode::UNAVAILABLE &&
          last.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
        break;
      }
    }
    current.store((tried + 1) % n, std::memory_order_relaxed);
    return wire::FromGrpc(last).WithContext(std::string("etcd ") + what +
                                            " at " + members[tried].address);
  }
};

EtcdClient::EtcdClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EtcdClient::~EtcdClient() = default;

Result<std::unique_ptr<EtcdClient>> EtcdClient::Create(
    const std::string& endpoints) {
  auto impl = std::make_unique<Impl>();
  impl->endpoints = endpoints;
  size_t pos = 0;
  while (pos <= endpoints.size()) {
    size_t comma = endpoints.find(',', pos);
    if (comma == std::string::npos) comma = endpoints.size();
    std::string ep = endpoints.substr(pos, comma - pos);
    pos = comma + 1;
    if (ep.rfind("http://", 0) == 0) ep = ep.substr(7);
    if (ep.empty() || ep.find(':') == std::string::npos ||
        ep.find('/') != std::string::npos) {
      return InvalidArgument(
          "etcd endpoints must be HOST:PORT[,HOST:PORT...]"
          " (plain http); got '" +
          endpoints + "'");
    }
    if (impl->members.size() >= kMaxEndpoints) {
      return InvalidArgument("at most " + std::to_string(kMaxEndpoints) +
                             " etcd endpoints");
    }
    grpc::ChannelArguments args;
    // etcd restarting or a member coming back: reconnect quickly.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    args.SetMaxReceiveMessageSize(64 << 20);
    Member m;
    m.address = ep;
    m.channel =
        grpc::CreateCustomChannel(ep, grpc::InsecureChannelCredentials(), args);
    m.kv = pb::KV::NewStub(m.channel);
    m.lease = pb::Lease::NewStub(m.channel);
    m.watch = pb::Watch::NewStub(m.channel);
    impl->members.push_back(std::move(m));
  }
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(impl)));
}

const std::string& EtcdClient::endpoints() const { return impl_->endpoints; }

std::string EtcdClient::PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    unsigned char c = static_cast<unsigned char>(end.back());
    if (c < 0xff) {
      end.back() = static_cast<char>(c + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

Result<RangeResult> EtcdClient::Range(const std::string& key,
                                      const std::string& range_end,
                                      int64_t limit, int64_t revision,
                                      const Deadline& deadline) {
  pb::RangeRequest req;
  req.set_key(key);
  req.set_range_end(range_end);
  req.set_limit(limit);
  req.set_revision(revision);
  pb::RangeResponse resp;
  TH_RETURN_IF_ERROR(impl_->Invoke(deadline, "range",
                                   [&](Member& m, grpc::ClientContext& ctx) {
                                     resp.Clear();
                                     return m.kv->Range(&ctx, req, &resp);
                                   }));
  RangeResult out;
  out.more = resp.more();
  out.revision = resp.header().revision();
  for (const mvccpb::KeyValue& kv : resp.kvs()) out.kvs.push_back(FromPb(kv));
  return out;
}

Result<TxnResult> EtcdClient::Txn(const std::vector<Compare>& guard,
                                  const std::vector<TxnOp>& success,
                                  const std::vector<TxnOp>& failure,
                                  const Deadline& deadline) {
  pb::TxnRequest req;
  for (const Compare& c : guard) ToPb(c, req.add_compare());
  for (const TxnOp& op : success) ToPb(op, req.add_success());
  for (const TxnOp& op : failure) ToPb(op, req.add_failure());
  pb::TxnResponse resp;
  // A transaction that timed out may have been applied and is then tried
  // on the next member: callers guard their transactions so that a repeat
  // is harmless and tell from the answer what happened (the coordinator's
  // campaign checks whose lease holds the key).
  TH_RETURN_IF_ERROR(
      impl_->Invoke(deadline, "txn", [&](Member& m, grpc::ClientContext& ctx) {
        resp.Clear();
        return m.kv->Txn(&ctx, req, &resp);
      }));
  TxnResult out;
  out.succeeded = resp.succeeded();
  out.revision = resp.header().revision();
  for (const pb::ResponseOp& r : resp.responses()) {
    if (!r.has_response_range()) continue;
    if (r.response_range().kvs_size() == 0) {
      out.gets.push_back(std::nullopt);
    } else {
      out.gets.push_back(FromPb(r.response_range().kvs(0)));
    }
  }
  return out;
}

Result<LeaseGrant> EtcdClient::GrantLease(int64_t ttl_s,
                                          const Deadline& deadline) {
  pb::LeaseGrantRequest req;
  req.set_ttl(ttl_s);
  pb::LeaseGrantResponse resp;
  TH_RETURN_IF_ERROR(impl_->Invoke(
      deadline, "lease grant", [&](Member& m, grpc::ClientContext& ctx) {
        resp.Clear();
        return m.lease->LeaseGrant(&ctx, req, &resp);
      }));
  if (!resp.error().empty()) {
    return Unavailable("etcd lease grant: " + resp.error());
  }
  return LeaseGrant{resp.id(), resp.ttl()};
}

Result<int64_t> EtcdClient::KeepAlive(int64_t lease_id,
                                      const Deadline& deadline) {
  pb::LeaseKeepAliveResponse resp;
  bool answered = false;
  // One request on a stream of its own: simple, and bounded by the
  // context's deadline (a stream kept open would need its own reader).
  TH_RETURN_IF_ERROR(impl_->Invoke(
      deadline, "lease keep-alive", [&](Member& m, grpc::ClientContext& ctx) {
        auto stream = m.lease->LeaseKeepAlive(&ctx);
        pb::LeaseKeepAliveRequest req;
        req.set_id(lease_id);
        answered =
            stream->Write(req) && stream->WritesDone() && stream->Read(&resp);
        grpc::Status s = stream->Finish();
        if (answered) return grpc::Status::OK;
        return s.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                     "keep-alive stream closed unanswered")
                      : s;
      }));
  return resp.ttl() > 0 ? resp.ttl() : 0;
}

Status EtcdClient::RevokeLease(int64_t lease_id, const Deadline& deadline) {
  pb::LeaseRevokeRequest req;
  req.set_id(lease_id);
  pb::LeaseRevokeResponse resp;
  return impl_->Invoke(deadline, "lease revoke",
                       [&](Member& m, grpc::ClientContext& ctx) {
                         return m.lease->LeaseRevoke(&ctx, req, &resp);
                       });
}

Result<std::optional<WatchEvent>> EtcdClient::WaitForChange(
    const std::string& key, int64_t start_revision, const Deadline& deadline) {
  Member& m = impl_->members[impl_->current.load(std::memory_order_relaxed) %
                             impl_->members.size()];
  grpc::ClientContext ctx;
  SetDeadline(ctx, deadline);
  {
    MutexLock lock(impl_->mu);
    if (impl_->cancelled) return std::optional<WatchEvent>();
    impl_->waiting = &ctx;
  }
  auto stream = m.watch->Watch(&ctx);
  pb::WatchRequest req;
  pb::WatchCreateRequest* create = req.mutable_create_request();
  create->set_key(key);
  create->set_start_revision(start_revision);
  std::optional<WatchEvent> event;
  Status refused;
  if (stream->Write(req)) {
    pb::WatchResponse resp;
    while (!event.has_value() && refused.ok() && stream->Read(&resp)) {
      if (resp.canceled()) {
        refused = FailedPrecondition(
            "etcd cancelled the watch of '" + key + "'" +
            (resp.compact_revision() > 0
                 ? " (revision " + std::to_string(start_revision) +
                       " was compacted)"
                 : std::string()) +
            (resp.cancel_reason().empty() ? "" : ": " + resp.cancel_reason()));
        break;
      }
      for (const mvccpb::Event& e : resp.events()) {
        WatchEvent w;
        w.type = e.type() == mvccpb::Event::DELETE ? WatchEvent::Type::kDelete
                                                   : WatchEvent::Type::kPut;
        w.kv = FromPb(e.kv());
        event = std::move(w);
        break;
      }
    }
  }
  ctx.TryCancel();
  grpc::Status fin = stream->Finish();
  {
    MutexLock lock(impl_->mu);
    impl_->waiting = nullptr;
  }
  if (event.has_value()) return event;
  if (!refused.ok()) return refused;
  if (fin.error_code() == grpc::StatusCode::UNAVAILABLE) {
    impl_->current.store((impl_->current.load(std::memory_order_relaxed) + 1) %
                             impl_->members.size(),
                         std::memory_order_relaxed);
    return wire::FromGrpc(fin).WithContext("etcd watch at " + m.address);
  }
  // The deadline passed or CancelWaits() ended it: no change.
  return std::optional<WatchEvent>();
}

void EtcdClient::CancelWaits() {
  MutexLock lock(impl_->mu);
  impl_->cancelled = true;
  if (impl_->waiting != nullptr) impl_->waiting->TryCancel();
}

}  // namespace tensorhub::ha
