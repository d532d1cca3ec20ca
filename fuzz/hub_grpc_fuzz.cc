// libFuzzer target for the hub as a hostile client meets it: a real hub
// (Hub::Start, with a secret) on loopback, called over real gRPC with any
// method path, any metadata and any request bytes. Unlike hub_proto_fuzz
// (the service called directly), this runs gRPC's own parsing and the
// hub's gate before the service (hub/call_gate.h).
//
// An input is a list of calls: [method byte][proof byte][2-byte length]
// [that many bytes of the request]. The proof byte picks the call's
// metadata: none, a valid proof, a proof of another secret, a stale valid
// proof, or the next bytes of the input as the proof's text. Invariants:
// no crash or sanitizer report; a call without a valid proof is refused
// with PERMISSION_DENIED whatever its method and request; and after every
// input the hub still answers a valid call.
#include <google/protobuf/descriptor.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/log.h"
#include "tensorhub.grpc.pb.h"
#include "tensorhub/hub.h"
#include "wire/call_proof.h"

namespace {

using namespace tensorhub;

constexpr char kSecret[] = "fuzz-secret";

struct Fuzz {
  Fuzz() {
    SetLogLevel(LogLevel::kError);
    HubOptions o;
    o.listen_address = "127.0.0.1:0";
    o.secret = kSecret;
    o.lease_ms = 1000;
    auto h = Hub::Start(o);
    if (!h.ok()) __builtin_trap();
    hub = std::move(h).value();
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(1 << 20);
    channel = grpc::CreateCustomChannel(
        hub->address(), grpc::InsecureChannelCredentials(), args);
    stub = std::make_unique<grpc::GenericStub>(channel);
    const google::protobuf::ServiceDescriptor* service =
        v1::RegisterWorkerRequest::descriptor()->file()->FindServiceByName(
            "Hub");
    for (int i = 0; service != nullptr && i < service->method_count(); ++i) {
      methods.push_back("/" + service->full_name() + "/" +
                        service->method(i)->name());
    }
    methods.push_back("/tensorhub.v1.Hub/NoSuchMethod");
    methods.push_back("/not.a.Service/Anything");
  }
  std::unique_ptr<Hub> hub;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<grpc::GenericStub> stub;
  std::vector<std::string> methods;
};

grpc::Status Call(Fuzz& f, const std::string& method, const std::string& proof,
                  const std::string& body) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!proof.empty()) ctx.AddMetadata(wire::kCallProofKey, proof);
  grpc::Slice slice(body);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status out;
  f.stub->UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response,
                    [&](grpc::Status s) {
                      std::lock_guard<std::mutex> l(mu);
                      out = std::move(s);
                      done = true;
                      cv.notify_all();
                    });
  std::unique_lock<std::mutex> l(mu);
  cv.wait(l, [&] { return done; });
  return out;
}

// Metadata values must be printable ASCII: gRPC refuses to send others.
std::string Printable(const uint8_t* p, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += static_cast<char>(0x20 + p[i] % 0x5f);
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fuzz* f = new Fuzz();
  size_t at = 0;
  int calls = 0;
  while (at + 4 <= size && calls < 16) {
    const uint8_t m = data[at], proof_kind = data[at + 1];
    const size_t len = std::min<size_t>(
        size - at - 4, static_cast<size_t>(data[at + 2] | data[at + 3] << 8));
    const std::string body(reinterpret_cast<const char*>(data + at + 4), len);
    at += 4 + len;
    ++calls;
    const std::string& method = f->methods[m % f->methods.size()];
    const int64_t now = wire::UnixNowMs();
    std::string proof;
    bool valid = false;
    switch (proof_kind % 5) {
      case 0:
        break;
      case 1:
        proof = wire::MakeCallProof(kSecret, now);
        valid = true;
        break;
      case 2:
        proof = wire::MakeCallProof("another secret", now);
        break;
      case 3:
        proof = wire::MakeCallProof(kSecret, now - 2 * wire::kMaxProofSkewMs);
        break;
      case 4:
        proof = Printable(reinterpret_cast<const uint8_t*>(body.data()),
                          std::min<size_t>(body.size(), 200));
        valid = wire::CheckCallProof(proof, kSecret, now).ok();
        break;
    }
    grpc::Status s = Call(*f, method, proof, body);
    if (!valid && s.error_code() != grpc::StatusCode::PERMISSION_DENIED) {
      __builtin_trap();  // served without the secret
    }
  }
  // Still serving.
  v1::ListModelsRequest req;
  std::string body;
  req.SerializeToString(&body);
  grpc::Status s = Call(*f, "/tensorhub.v1.Hub/ListModels",
                        wire::MakeCallProof(kSecret, wire::UnixNowMs()), body);
  if (!s.ok()) __builtin_trap();
  return 0;
}
