// TLS on both planes with a real hub, real clients and the real TCP data
// plane in one process, on certificates made by the openssl command
// (tls/throwaway_pki.h): mutual TLS to the hub, its refusals, plaintext/TLS
// mismatches on either plane, and a publish/fetch that is byte-exact over
// TLS on both planes (the kernel's or OpenSSL's: kernel TLS itself is
// checked by tls_unit_test and tls_transport_test).
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "demo_model.h"
#include "hub/hub_service.h"
#include "process_util.h"
#include "tensorhub/client.h"
#include "test_roles.h"
#include "tls/pki_test_base.h"
#include "tls/throwaway_pki.h"
#include "tls/tls.h"

namespace tensorhub::testing {
namespace {

using cli::SyntheticModel;
using tls::ThrowawayPki;

bool Has(const Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

class TlsIntegrationTest : public tls::PkiTest {
 protected:
  // A hub on loopback: TLS with `cert`/`key` unless empty, client
  // certificates required if `client_ca` is not empty.
  void StartHub(const std::string& cert, const std::string& key,
                const std::string& client_ca = "") {
    HubOptions o;
    o.listen_address = "127.0.0.1:0";
    o.rebuild_ms = 0;
    o.lease_ms = 30000;  // no worker dropped for a slow heartbeat
    o.tls_cert_file = cert;
    o.tls_key_file = key;
    o.tls_client_ca_file = client_ca;
    auto hub = Hub::Start(o);
    ASSERT_TRUE(hub.ok()) << hub.status().ToString();
    hub_ = std::move(hub).value();
  }

  // Options of a worker with the deployment's CA and its own certificate.
  ClientOptions Worker(const std::string& name, bool data_tls) const {
    ClientOptions o;
    o.hub_address = hub_->address();
    o.name = name;
    o.tls_ca_file = pki_->ca;
    o.tls_cert_file = pki_->worker_cert;
    o.tls_key_file = pki_->worker_key;
    o.data_tls = data_tls;
    return o;
  }

  // A refused connection waits for the hub until connect_timeout_ms (gRPC
  // only says it could not connect), then says why: keep it short.
  static Status ConnectError(ClientOptions o) {
    o.connect_timeout_ms = 1500;
    auto c = Client::Connect(o);
    return c.ok() ? Status::Ok() : c.status();
  }

  std::unique_ptr<Hub> hub_;
};

// The whole path over TLS: the trainer and the reader reach the hub by
// mutual TLS, the reader pulls the bytes over data-plane TLS (the secret's
// challenge inside it), and a second reader pulls them from the first.
TEST_F(TlsIntegrationTest, PublishAndFetchOverTlsOnBothPlanesIsByteExact) {
  StartHub(pki_->hub_cert, pki_->hub_key, pki_->ca);
  // No secret: client certificates guard the hub.
  auto trainer = Client::Connect(Worker("trainer", true));
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  SyntheticModel src(TestLayout(8 << 20));
  src.Fill(11);
  ASSERT_TRUE((*trainer)->Publish("m", Version(1), src.tensors()).ok());

  ClientOptions ro = Worker("reader", true);
  ro.tls_cert_file = pki_->worker2_cert;  // another worker's certificate
  ro.tls_key_file = pki_->worker2_key;
  auto reader = Client::Connect(ro);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  SyntheticModel dst(TestLayout(8 << 20));
  auto st = (*reader)->Fetch("m", Version::Latest(), dst.tensors());
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->version, Version(1));
  EXPECT_EQ(dst.Digest(), src.Digest());
  EXPECT_GT(st->tls_connections, 0u);
  EXPECT_LE(st->kernel_tls_connections, st->tls_connections);

  // The first reader serves it on: a fetch from it only.
  ASSERT_TRUE((*trainer)->Unpublish("m", Version(1)).ok());
  auto reader2 = Client::Connect(Worker("reader2", true));
  ASSERT_TRUE(reader2.ok()) << reader2.status().ToString();
  SyntheticModel dst2(TestLayout(8 << 20));
  st = (*reader2)->Fetch("m", Version(1), dst2.tensors());
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(dst2.Digest(), src.Digest());
  EXPECT_GT(st->tls_connections, 0u);
  // The holders' sends ran in the kernel where it has kTLS, else in
  // OpenSSL; which one is checked by the kernel TLS tests of tls_unit_test
  // and tls_transport_test (they skip, saying so, without kTLS).
}

// A shared secret and TLS together (the secret's challenge runs inside data
// TLS; src/transport/tcp/tls_transport_test.cc checks that it still refuses).
TEST_F(TlsIntegrationTest, SharedSecretAndTlsTogether) {
  HubOptions ho;
  ho.listen_address = "127.0.0.1:0";
  ho.rebuild_ms = 0;
  ho.lease_ms = 30000;
  ho.secret = "s3cret";
  ho.tls_cert_file = pki_->hub_cert;
  ho.tls_key_file = pki_->hub_key;
  auto hub = Hub::Start(ho);
  ASSERT_TRUE(hub.ok()) << hub.status().ToString();
  hub_ = std::move(hub).value();
  ClientOptions to = Worker("trainer", true);
  to.secret = "s3cret";
  auto trainer = Client::Connect(to);
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  SyntheticModel src(TestLayout(1 << 20));
  src.Fill(3);
  ASSERT_TRUE((*trainer)->Publish("m", Version(1), src.tensors()).ok());
  ClientOptions ro = Worker("reader", true);
  ro.secret = "s3cret";
  auto reader = Client::Connect(ro);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  SyntheticModel dst(TestLayout(1 << 20));
  auto st = (*reader)->Fetch("m", Version(1), dst.tensors());
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(dst.Digest(), src.Digest());
  // Without the secret the hub refuses, over TLS as without it.
  ClientOptions wrong = Worker("no-secret", false);
  EXPECT_EQ(ConnectError(wrong).code(), StatusCode::kPermissionDenied);
}

TEST_F(TlsIntegrationTest, MutualTlsRefusesClientWithoutCertificate) {
  StartHub(pki_->hub_cert, pki_->hub_key, pki_->ca);
  ClientOptions o = Worker("no-cert", false);
  o.tls_cert_file.clear();
  o.tls_key_file.clear();
  Status s = ConnectError(o);
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
  EXPECT_TRUE(Has(s, "requires a client certificate")) << s.ToString();
  EXPECT_TRUE(Has(s, "--tls-cert")) << s.ToString();
}

TEST_F(TlsIntegrationTest, MutualTlsRefusesCertificateOfAnotherCa) {
  StartHub(pki_->hub_cert, pki_->hub_key, pki_->ca);
  ClientOptions o = Worker("rogue", false);
  o.tls_cert_file = pki_->rogue_cert;
  o.tls_key_file = pki_->rogue_key;
  Status s = ConnectError(o);
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
  EXPECT_TRUE(Has(s, "refused this client's certificate")) << s.ToString();
}

TEST_F(TlsIntegrationTest, PlaintextClientToTlsHubSaysWhatToPass) {
  StartHub(pki_->hub_cert, pki_->hub_key);
  ClientOptions o;
  o.hub_address = hub_->address();
  Status s = ConnectError(o);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_TRUE(Has(s, "serves TLS")) << s.ToString();
  EXPECT_TRUE(Has(s, "--tls-ca")) << s.ToString();
}

TEST_F(TlsIntegrationTest, TlsClientToPlaintextHubSaysWhatToPass) {
  StartHub("", "");
  Status s = ConnectError(Worker("tls-client", false));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_TRUE(Has(s, "does not speak TLS")) << s.ToString();
  EXPECT_TRUE(Has(s, "--tls-cert")) << s.ToString();
}

TEST_F(TlsIntegrationTest, HubCertificateOfAnotherCaIsNotTrusted) {
  StartHub(pki_->hub_cert, pki_->hub_key);
  ClientOptions o = Worker("distrustful", false);
  o.tls_ca_file = pki_->other_ca;
  Status s = ConnectError(o);
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
  EXPECT_TRUE(Has(s, "does not trust")) << s.ToString();
}

// A hub certificate that names another host: refused, with the way out;
// the server-name override takes it.
TEST_F(TlsIntegrationTest, HubCertificateNameAndServerNameOverride) {
  StartHub(pki_->hub_named_cert, pki_->hub_named_key);
  Status s = ConnectError(Worker("by-address", false));
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
  EXPECT_TRUE(Has(s, "tls_server_name")) << s.ToString();
  ClientOptions o = Worker("by-name", false);
  o.tls_server_name = "hub.example";
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto models = (*c)->List();
  EXPECT_TRUE(models.ok()) << models.status().ToString();
}

TEST_F(TlsIntegrationTest, BadFilesAreNamedAtStart) {
  HubOptions ho;
  ho.listen_address = "127.0.0.1:0";
  ho.tls_cert_file = pki_->hub_cert;
  ho.tls_key_file = pki_->Path("missing.key");
  Status s = Hub::Start(ho).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(s, "tls_key (--tls-key) file '" + ho.tls_key_file + "'"))
      << s.ToString();
  ho.tls_key_file = pki_->worker_key;  // not the hub certificate's key
  s = Hub::Start(ho).status();
  EXPECT_TRUE(Has(s, "is not the private key of")) << s.ToString();
  ho.tls_key_file = pki_->hub_key;
  ho.tls_client_ca_file = pki_->not_pem;
  s = Hub::Start(ho).status();
  EXPECT_TRUE(Has(s, "--tls-client-ca) file")) << s.ToString();
  HubOptions no_cert;
  no_cert.listen_address = "127.0.0.1:0";
  no_cert.tls_client_ca_file = pki_->ca;
  s = Hub::Start(no_cert).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);

  StartHub(pki_->hub_cert, pki_->hub_key);
  ClientOptions o = Worker("data-tls-without-cert", true);
  o.tls_cert_file.clear();
  o.tls_key_file.clear();
  s = ConnectError(o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(s, "--data-tls")) << s.ToString();
  ClientOptions no_ca;
  no_ca.hub_address = hub_->address();
  no_ca.data_tls = true;
  s = ConnectError(no_ca);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(s, "--tls-ca")) << s.ToString();
}

// A reader and a holder that disagree about data-plane TLS refuse each
// other, saying which end has it, either way round.
TEST_F(TlsIntegrationTest, DataPlaneTlsMismatchIsRefusedEitherWay) {
  StartHub(pki_->hub_cert, pki_->hub_key);
  SyntheticModel src(TestLayout(1 << 20));
  src.Fill(5);
  FetchOptions fo;
  fo.timeout_ms = 10000;
  fo.serve = false;
  for (bool holder_tls : {true, false}) {
    SCOPED_TRACE(holder_tls ? "TLS holder, plain reader"
                            : "plain holder, TLS reader");
    const std::string model = holder_tls ? "tls-held" : "plain-held";
    auto holder = Client::Connect(Worker("holder", holder_tls));
    ASSERT_TRUE(holder.ok()) << holder.status().ToString();
    ASSERT_TRUE((*holder)->Publish(model, Version(1), src.tensors()).ok());
    auto reader = Client::Connect(Worker("reader", !holder_tls));
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    SyntheticModel dst(TestLayout(1 << 20));
    auto st = (*reader)->Fetch(model, Version(1), dst.tensors(), fo);
    ASSERT_FALSE(st.ok());
    EXPECT_TRUE(Has(st.status(), holder_tls
                                     ? "the holder uses TLS on the data plane"
                                     : "the holder does not use TLS"))
        << st.status().ToString();
  }
}

}  // namespace
}  // namespace tensorhub::testing

int main(int argc, char** argv) {
  return tensorhub::testing::RoleOrTestsMain(argc, argv,
                                             tensorhub::testing::MaybeRunRole);
}
