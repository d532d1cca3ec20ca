#include "hub/call_gate.h"

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>

#include <cstring>
#include <string_view>

namespace tensorhub::hub {
namespace {

std::string_view View(const grpc_slice& s) {
  return {reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(s)),
          GRPC_SLICE_LENGTH(s)};
}

// gRPC's C hook (grpc_auth_metadata_processor): runs on the thread that
// read the call's headers, and answers at once. `state` is the
// std::shared_ptr<CallGate> the credentials hold.
void ProcessMetadata(void* state, grpc_auth_context* /*context*/,
                     const grpc_metadata* md, size_t num_md,
                     grpc_process_auth_metadata_done_cb cb, void* user_data) {
  CallGate* gate = static_cast<std::shared_ptr<CallGate>*>(state)->get();
  std::string_view proof;
  for (size_t i = 0; i < num_md; ++i) {
    if (View(md[i].key) == wire::kCallProofKey) {
      proof = View(md[i].value);
      break;
    }
  }
  Status s = gate->Check(proof);
  if (s.ok()) {
    cb(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_OK, nullptr);
    return;
  }
  const std::string message = s.message();  // gRPC copies it
  cb(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_PERMISSION_DENIED,
     message.c_str());
}

void DestroyGate(void* state) {
  delete static_cast<std::shared_ptr<CallGate>*>(state);
}

// Server credentials made with gRPC's C API (see call_gate.h for why),
// bound to a port the way grpc::ServerCredentials are.
class CoreServerCredentials final : public grpc::ServerCredentials {
 public:
  explicit CoreServerCredentials(grpc_server_credentials* creds)
      : creds_(creds) {}
  ~CoreServerCredentials() override { grpc_server_credentials_release(creds_); }
  void SetAuthMetadataProcessor(
      const std::shared_ptr<grpc::AuthMetadataProcessor>&) override {
    // Not used: the processor is the C one, set at creation.
  }

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    return grpc_server_add_http2_port(server, addr.c_str(), creds_);
  }
  grpc_server_credentials* const creds_;
};

}  // namespace

CallGate::CallGate(std::string secret, bool accept_request_secret)
    : secret_(std::move(secret)),
      accept_request_secret_(accept_request_secret) {}

Status CallGate::Check(std::string_view proof) {
  if (proof.empty() && accept_request_secret_) {
    legacy_.fetch_add(1, std::memory_order_relaxed);
    return Status::Ok();  // the service checks the request's secret
  }
  wire::ProofRefusal why = wire::ProofRefusal::kNone;
  Status s = wire::CheckCallProof(proof, secret_, wire::UnixNowMs(), &why);
  if (!s.ok()) {
    refused_[static_cast<int>(why)].fetch_add(1, std::memory_order_relaxed);
    log_.Refused("callers without a valid proof of the shared secret",
                 std::string(wire::ProofRefusalName(why)) + " proof");
  }
  return s;
}

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(
    const tls::Credentials* tls, std::shared_ptr<CallGate> gate) {
  // The C calls below need an initialised library; the credentials object
  // (a GrpcLibraryCodegen) keeps its own reference once made.
  grpc_init();
  grpc_server_credentials* creds = nullptr;
  if (tls == nullptr) {
    creds = grpc_insecure_server_credentials_create();
  } else {
    grpc_ssl_pem_key_cert_pair pair{tls->key.c_str(), tls->cert_chain.c_str()};
    creds = grpc_ssl_server_credentials_create_ex(
        tls->ca.empty() ? nullptr : tls->ca.c_str(), &pair, 1,
        tls->ca.empty()
            ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
            : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY,
        nullptr);
  }
  if (gate != nullptr) {
    // The credentials own the gate (through `state`, which DestroyGate
    // frees when gRPC drops them).
    grpc_auth_metadata_processor p{};
    p.process = ProcessMetadata;
    p.destroy = DestroyGate;
    p.state = new std::shared_ptr<CallGate>(std::move(gate));
    grpc_server_credentials_set_auth_metadata_processor(creds, p);
  }
  auto out = std::make_shared<CoreServerCredentials>(creds);
  grpc_shutdown();
  return out;
}

}  // namespace tensorhub::hub
