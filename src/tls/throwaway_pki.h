// A throwaway public-key infrastructure for tests and `tensorhub bench pair
// --data-tls`, made with the `openssl` command (Debian's openssl package) as
// an operator would make one. One CA signs a certificate for the hub and
// two for workers; a second, unrelated CA signs a "rogue" worker
// certificate, for the refusals. Never for production: the keys lie in
// /tmp. Header-only.
#ifndef TENSORHUB_TLS_THROWAWAY_PKI_H_
#define TENSORHUB_TLS_THROWAWAY_PKI_H_

#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "tensorhub/status.h"

namespace tensorhub::tls {

class ThrowawayPki {
 public:
  std::string dir;
  std::string ca;  // the deployment's CA certificate
  // Hub: names localhost and 127.0.0.1. hub_named_cert names only
  // hub.example (for tls_server_name).
  std::string hub_cert, hub_key, hub_named_cert, hub_named_key;
  // Workers (serverAuth and clientAuth: a worker is both ends).
  std::string worker_cert, worker_key, worker2_cert, worker2_key;
  std::string other_ca;               // an unrelated CA
  std::string rogue_cert, rogue_key;  // a worker certificate of other_ca
  std::string not_pem;                // a file that is not PEM

  // Makes it all in a new directory under /tmp (removed by the
  // destructor). UNAVAILABLE with the commands' output if openssl fails.
  static Result<std::unique_ptr<ThrowawayPki>> Make() {
    char tmpl[] = "/tmp/tensorhub-pki-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return Unavailable("mkdtemp failed");
    std::unique_ptr<ThrowawayPki> p(new ThrowawayPki());
    p->dir = tmpl;
    TH_RETURN_IF_ERROR(p->Write("leaf.ext",
                                "basicConstraints=CA:FALSE\n"
                                "keyUsage=critical,digitalSignature\n"
                                "extendedKeyUsage=serverAuth,clientAuth\n"
                                "subjectAltName=DNS:localhost,IP:127.0.0.1\n"));
    TH_RETURN_IF_ERROR(p->Write("named.ext",
                                "basicConstraints=CA:FALSE\n"
                                "keyUsage=critical,digitalSignature\n"
                                "extendedKeyUsage=serverAuth,clientAuth\n"
                                "subjectAltName=DNS:hub.example\n"));
    TH_RETURN_IF_ERROR(p->Write("not.pem", "this is not a certificate\n"));
    TH_RETURN_IF_ERROR(p->MakeCa("ca"));
    TH_RETURN_IF_ERROR(p->MakeCa("other-ca"));
    TH_RETURN_IF_ERROR(p->MakeLeaf("hub", "ca", "leaf.ext"));
    TH_RETURN_IF_ERROR(p->MakeLeaf("hub-named", "ca", "named.ext"));
    TH_RETURN_IF_ERROR(p->MakeLeaf("worker", "ca", "leaf.ext"));
    TH_RETURN_IF_ERROR(p->MakeLeaf("worker2", "ca", "leaf.ext"));
    TH_RETURN_IF_ERROR(p->MakeLeaf("rogue", "other-ca", "leaf.ext"));
    p->ca = p->Path("ca.pem");
    p->other_ca = p->Path("other-ca.pem");
    p->hub_cert = p->Path("hub.pem");
    p->hub_key = p->Path("hub.key");
    p->hub_named_cert = p->Path("hub-named.pem");
    p->hub_named_key = p->Path("hub-named.key");
    p->worker_cert = p->Path("worker.pem");
    p->worker_key = p->Path("worker.key");
    p->worker2_cert = p->Path("worker2.pem");
    p->worker2_key = p->Path("worker2.key");
    p->rogue_cert = p->Path("rogue.pem");
    p->rogue_key = p->Path("rogue.key");
    p->not_pem = p->Path("not.pem");
    return p;
  }

  ~ThrowawayPki() {
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
  }

  std::string Path(const std::string& name) const { return dir + "/" + name; }

 private:
  ThrowawayPki() = default;

  Status Write(const std::string& name, const std::string& text) {
    std::ofstream out(Path(name));
    out << text;
    return out ? Status::Ok() : Unavailable("cannot write " + Path(name));
  }

  Status Run(const std::string& args) {
    const std::string cmd =
        "cd '" + dir + "' && openssl " + args + " >> openssl.log 2>&1";
    if (std::system(cmd.c_str()) == 0) return Status::Ok();
    std::ifstream log(Path("openssl.log"));
    std::string text((std::istreambuf_iterator<char>(log)),
                     std::istreambuf_iterator<char>());
    return Unavailable("`openssl " + args +
                       "` failed (is the openssl "
                       "command installed?): " +
                       text);
  }

  Status MakeCa(const std::string& name) {
    return Run(
        "req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
        "-nodes -keyout " +
        name + ".key -out " + name + ".pem -days 3 -subj /CN=tensorhub-test-" +
        name +
        " -addext basicConstraints=critical,CA:TRUE"
        " -addext keyUsage=critical,keyCertSign,cRLSign");
  }

  Status MakeLeaf(const std::string& name, const std::string& ca,
                  const std::string& ext) {
    TH_RETURN_IF_ERROR(
        Run("req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
            "-keyout " +
            name + ".key -out " + name + ".csr -subj /CN=" + name));
    return Run("x509 -req -in " + name + ".csr -CA " + ca + ".pem -CAkey " +
               ca + ".key -CAcreateserial -out " + name +
               ".pem -days 3 "
               "-extfile " +
               ext);
  }
};

}  // namespace tensorhub::tls

#endif  // TENSORHUB_TLS_THROWAWAY_PKI_H_
