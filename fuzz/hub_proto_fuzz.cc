// libFuzzer target for the hub's control path: bytes -> a request message of
// each RPC -> the hub service's conversion and validation -> the state machine.
// One hub lives across all inputs (with small limits), so sequences of calls
// build up state and the fuzzer can find state bugs, not only decoder bugs.
//
// An input is a list of calls: [selector byte][worker byte][2-byte length]
// [that many bytes of the message]. The worker byte may swap the message's
// worker id for one the hub handed out earlier, so calls reach registered
// workers. Invariants checked: no crash or sanitizer report; every manifest
// the hub hands out (Resolve) converts back and validates; the hub stays
// within its limits.
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/log.h"
#include "hub/hub_service_internal.h"
#include "wire/proto_convert.h"

namespace {

using namespace tensorhub;

struct Fuzz {
  Fuzz() {
    SetLogLevel(LogLevel::kError);
    // Parse failures (invalid UTF-8 in a string field, ...) are expected here.
    google::protobuf::SetLogHandler([](google::protobuf::LogLevel, const char*,
                                       int, const std::string&) {});
    hub::HubConfig c;
    c.lease_ms = 1000;
    c.max_workers = 64;
    c.max_models = 16;
    c.max_dead_versions_per_model = 8;
    service = hub::NewHubService(c, "");
  }
  std::unique_ptr<v1::Hub::Service> service;
  std::vector<std::string> workers;  // ids the hub handed out
  uint64_t calls = 0;
};

template <typename Req>
bool Parse(Req* req, const uint8_t* data, size_t size, Fuzz& f,
           uint8_t worker) {
  if (!req->ParseFromArray(data, static_cast<int>(size))) return false;
  if (worker & 1 && !f.workers.empty()) {
    req->set_worker_id(f.workers[(worker >> 1) % f.workers.size()]);
  }
  return true;
}

void Call(Fuzz& f, uint8_t selector, uint8_t worker, const uint8_t* data,
          size_t size) {
  grpc::ServerContext ctx;
  v1::Hub::Service* s = f.service.get();
  switch (selector % 13) {
    case 0: {
      v1::RegisterWorkerRequest req;
      v1::RegisterWorkerResponse resp;
      if (!req.ParseFromArray(data, static_cast<int>(size))) return;
      if (s->RegisterWorker(&ctx, &req, &resp).ok() && f.workers.size() < 256) {
        f.workers.push_back(resp.worker_id());
      }
      return;
    }
    case 1: {
      v1::HeartbeatRequest req;
      v1::HeartbeatResponse resp;
      if (Parse(&req, data, size, f, worker))
        (void)s->Heartbeat(&ctx, &req, &resp);
      return;
    }
    case 2: {
      v1::PublishRequest req;
      v1::PublishResponse resp;
      if (Parse(&req, data, size, f, worker))
        (void)s->Publish(&ctx, &req, &resp);
      return;
    }
    case 3: {
      v1::AddHolderRequest req;
      v1::AddHolderResponse resp;
      if (Parse(&req, data, size, f, worker))
        (void)s->AddHolder(&ctx, &req, &resp);
      return;
    }
    case 4: {
      v1::UnpublishRequest req;
      v1::UnpublishResponse resp;
      if (Parse(&req, data, size, f, worker))
        (void)s->Unpublish(&ctx, &req, &resp);
      return;
    }
    case 5: {
      v1::ResolveRequest req;
      v1::ResolveResponse resp;
      if (!Parse(&req, data, size, f, worker)) return;
      if (s->Resolve(&ctx, &req, &resp).ok() && !resp.manifest().empty()) {
        // What the hub hands to readers must itself be a valid manifest.
        v1::VersionManifest vm;
        if (!vm.ParseFromString(resp.manifest())) __builtin_trap();
        if (!wire::FromProto(vm).ok()) __builtin_trap();
      }
      return;
    }
    case 6: {
      v1::ScheduleRequest req;
      v1::ScheduleResponse resp;
      if (!Parse(&req, data, size, f, worker)) return;
      if (s->Schedule(&ctx, &req, &resp).ok() &&
          resp.holders_size() > static_cast<int>(req.max_sources())) {
        __builtin_trap();
      }
      return;
    }
    case 7: {
      v1::FetchDoneRequest req;
      v1::FetchDoneResponse resp;
      if (Parse(&req, data, size, f, worker))
        (void)s->FetchDone(&ctx, &req, &resp);
      return;
    }
    case 8: {
      v1::LeaveRequest req;
      v1::LeaveResponse resp;
      if (Parse(&req, data, size, f, worker)) (void)s->Leave(&ctx, &req, &resp);
      return;
    }
    case 9: {
      v1::ReportProgressRequest req;
      v1::ReportProgressResponse resp;
      if (Parse(&req, data, size, f, worker))
        (void)s->ReportProgress(&ctx, &req, &resp);
      return;
    }
    case 10: {
      v1::SnapshotRequest req;
      v1::SnapshotResponse resp;
      if (!req.ParseFromArray(data, static_cast<int>(size))) return;
      if (!s->Snapshot(&ctx, &req, &resp).ok()) __builtin_trap();
      // Bounded whatever was asked (kMaxSnapshot*).
      if (resp.models_size() > 256 || resp.transfers_size() > 1024 ||
          resp.slowest_size() > 64) {
        __builtin_trap();
      }
      return;
    }
    case 11: {
      v1::ReportDeltaRequest req;
      v1::ReportDeltaResponse resp;
      if (Parse(&req, data, size, f, worker))
        (void)s->ReportDelta(&ctx, &req, &resp);
      return;
    }
    default: {
      v1::ListModelsRequest req;
      v1::ListModelsResponse resp;
      if (!req.ParseFromArray(data, static_cast<int>(size))) return;
      if (!s->ListModels(&ctx, &req, &resp).ok()) __builtin_trap();
      if (resp.models_size() > 16) __builtin_trap();  // max_models
      return;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fuzz* f = new Fuzz();
  size_t pos = 0;
  while (pos + 4 <= size) {
    uint8_t selector = data[pos];
    uint8_t worker = data[pos + 1];
    size_t len = data[pos + 2] | (size_t{data[pos + 3]} << 8);
    pos += 4;
    len = std::min(len, size - pos);
    Call(*f, selector, worker, data + pos, len);
    pos += len;
    // Leases are real time (a few ms per input): expire now and then so
    // workers come and go as they would.
    if (++f->calls % 64 == 0) hub::ExpireLeases(f->service.get());
  }
  return 0;
}
