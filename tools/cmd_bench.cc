// `tensorhub bench pair`: one holder process, one reader, loopback. Prints
// TensorHub's fetch rate beside the limits measured in the same run: a plain
// TCP socket pair moving the same bytes (1 stream, and as many streams as the
// fetch uses) and memcpy. With --data-tls, a second holder serves the same
// bytes over data-plane TLS (certificates from a throwaway CA made with the
// openssl command), fetched in the same rounds, so TLS's cost is measured
// beside plain TCP; the line above the table says whether kernel TLS ran.
//
// `tensorhub bench local`: the same two processes, fetching over the
// intra-host path (cross-memory attach) and, for comparison, forced over
// TCP (TENSORHUB_NO_CMA=1 for that reader), beside memcpy and a raw
// process_vm_readv measured in the same run.
//
// `tensorhub bench ucx`: the same two processes with the UCX data plane,
// beside UCX's own ucx_perftest (ucp_am_bw, ucp_get, tag_bw of the same bytes
// between two processes, with the same UCX_TLS) and memcpy, in the same run.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include "cli_util.h"
#include "common/log.h"
#include "demo_model.h"
#include "hub/hub_service.h"
#include "subprocess.h"
#include "tls/throwaway_pki.h"
#include "tls/tls.h"
#include "transport/tcp/cma.h"
#include "transport/tcp/socket_util.h"
#include "transport/tcp/tcp_transport.h"

namespace tensorhub::cli {
namespace {

constexpr char kModel[] = "bench-pair";
constexpr char kTlsModel[] = "bench-pair-tls";  // served by the TLS holder

std::vector<TensorSpec> FlatLayout(uint64_t bytes) {
  // 64 MiB tensors plus a tail: big tensors like a real model's matrices.
  std::vector<TensorSpec> specs;
  uint64_t left = bytes, i = 0;
  while (left > 0) {
    uint64_t n = std::min<uint64_t>(left, 64ull << 20);
    specs.push_back({"t" + std::to_string(i++), DType::kU8, {n}});
    left -= n;
  }
  return specs;
}

double Seconds(std::chrono::steady_clock::time_point a,
               std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Moves `bytes` from src to dst over `streams` loopback TCP connections, each
// carrying an equal slice, with plain blocking send/recv of 4 MiB calls.
Result<double> RawTcp(const uint8_t* src, uint8_t* dst, uint64_t bytes,
                      int streams) {
  using transport::Fd;
  TH_ASSIGN_OR_RETURN(Fd listener, transport::ListenTcp("127.0.0.1:0", 64));
  TH_ASSIGN_OR_RETURN(std::string addr,
                      transport::LocalAddress(listener.get()));
  std::vector<Fd> senders, receivers;
  for (int i = 0; i < streams; ++i) {
    TH_ASSIGN_OR_RETURN(Fd c,
                        transport::ConnectTcp(addr, Deadline::AfterMs(5000)));
    int s = ::accept(listener.get(), nullptr, nullptr);
    if (s < 0) return Internal("accept failed");
    // Blocking sockets, like a textbook socket pair.
    int fl = fcntl(c.get(), F_GETFL);
    fcntl(c.get(), F_SETFL, fl & ~O_NONBLOCK);
    senders.push_back(std::move(c));
    receivers.emplace_back(s);
  }
  uint64_t slice = (bytes + streams - 1) / streams;
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  std::atomic<bool> failed{false};
  for (int i = 0; i < streams; ++i) {
    uint64_t begin = std::min<uint64_t>(bytes, i * slice);
    uint64_t end = std::min<uint64_t>(bytes, begin + slice);
    threads.emplace_back([&, i, begin, end] {
      for (uint64_t off = begin; off < end;) {
        ssize_t n =
            ::send(senders[i].get(), src + off,
                   std::min<uint64_t>(4 << 20, end - off), MSG_NOSIGNAL);
        if (n <= 0) {
          failed = true;
          return;
        }
        off += n;
      }
    });
    threads.emplace_back([&, i, begin, end] {
      for (uint64_t off = begin; off < end;) {
        ssize_t n = ::recv(receivers[i].get(), dst + off,
                           std::min<uint64_t>(4 << 20, end - off), 0);
        if (n <= 0) {
          failed = true;
          return;
        }
        off += n;
      }
    });
  }
  for (auto& t : threads) t.join();
  auto t1 = std::chrono::steady_clock::now();
  if (failed) return Internal("raw TCP transfer failed");
  if (std::memcmp(src, dst, bytes) != 0)
    return Internal("raw TCP bytes differ");
  return bytes / Seconds(t0, t1) / 1e9;
}

// Moves `bytes` from src to dst over one loopback TLS connection with the
// data plane's TLS (`ctx`; 4 MiB writes and reads, handshake not timed):
// what OpenSSL's TLS costs on this machine, without TensorHub's protocol.
Result<double> RawTls(const tls::Context& ctx, const uint8_t* src, uint8_t* dst,
                      uint64_t bytes) {
  using transport::Fd;
  TH_ASSIGN_OR_RETURN(Fd listener, transport::ListenTcp("127.0.0.1:0", 4));
  TH_ASSIGN_OR_RETURN(std::string addr,
                      transport::LocalAddress(listener.get()));
  TH_ASSIGN_OR_RETURN(Fd c,
                      transport::ConnectTcp(addr, Deadline::AfterMs(5000)));
  Fd s(::accept(listener.get(), nullptr, nullptr));
  if (!s.valid()) return Internal("accept failed");
  transport::TuneStream(s.get());
  constexpr uint64_t kPiece = 4 << 20;
  const Deadline deadline = Deadline::AfterMs(600000);
  Status sent;
  std::thread server([&] {
    auto session = tls::Session::Handshake(
        ctx.server(), tls::Session::Role::kServer, s.get(), deadline);
    sent = session.status();
    for (uint64_t off = 0; sent.ok() && off < bytes; off += kPiece) {
      iovec v{const_cast<uint8_t*>(src) + off, std::min(kPiece, bytes - off)};
      sent = (*session)->Write({&v, 1}, deadline);
    }
  });
  auto session = tls::Session::Handshake(
      ctx.client(), tls::Session::Role::kClient, c.get(), deadline);
  Status got = session.status();
  auto t0 = std::chrono::steady_clock::now();
  for (uint64_t off = 0; got.ok() && off < bytes; off += kPiece) {
    iovec v{dst + off, std::min(kPiece, bytes - off)};
    got = (*session)->Read({&v, 1}, deadline);
  }
  auto t1 = std::chrono::steady_clock::now();
  if (!got.ok()) ::shutdown(c.get(), SHUT_RDWR);  // unblock the server
  server.join();
  TH_RETURN_IF_ERROR(got.WithContext("raw TLS read"));
  TH_RETURN_IF_ERROR(sent.WithContext("raw TLS write"));
  if (std::memcmp(src, dst, bytes) != 0)
    return Internal("raw TLS bytes differ");
  return bytes / Seconds(t0, t1) / 1e9;
}

double Memcpy(const uint8_t* src, uint8_t* dst, uint64_t bytes) {
  auto t0 = std::chrono::steady_clock::now();
  std::memcpy(dst, src, bytes);
  auto t1 = std::chrono::steady_clock::now();
  return bytes / Seconds(t0, t1) / 1e9;
}

// process_vm_readv of this process's own memory in the segments the
// transport uses: the primitive's limit on this machine, no protocol.
Result<double> RawCma(const uint8_t* src, uint8_t* dst, uint64_t bytes) {
  std::vector<wire::LocalPiece> remote = {
      {reinterpret_cast<uint64_t>(src), bytes}};
  iovec d{dst, bytes};
  auto t0 = std::chrono::steady_clock::now();
  TH_RETURN_IF_ERROR(transport::CopyFromProcess(
      ::getpid(), remote, {&d, 1}, transport::kCmaSegmentBytes, nullptr,
      transport::ProcessVmReadv));
  auto t1 = std::chrono::steady_clock::now();
  if (std::memcmp(src, dst, bytes) != 0)
    return Internal("raw CMA bytes differ");
  return bytes / Seconds(t0, t1) / 1e9;
}

// Reads the first chunk straight from the holder with the default transport
// and reports how many process_vm_readv calls it took (0: it went by TCP).
// The bench holder publishes once, so its registration epoch is 1.
Result<int> ProbeLocalPath(const std::string& address, uint64_t bytes) {
  auto calls = std::make_shared<std::atomic<int>>(0);
  transport::TcpTransportOptions o;
  o.copy_fn = [calls](pid_t pid, const iovec* l, unsigned long nl,
                      const iovec* r, unsigned long nr) {
    calls->fetch_add(1);
    return transport::ProcessVmReadv(pid, l, nl, r, nr);
  };
  auto t = transport::MakeTcpTransport(o);
  TH_ASSIGN_OR_RETURN(auto conn, t->Connect(address, Deadline::AfterMs(5000)));
  std::vector<uint8_t> out(bytes);
  iovec v{out.data(), out.size()};
  wire::ReadRequest req;
  req.model = kModel;
  req.version = 1;
  req.epoch = 1;
  req.part = 0;
  req.offset = 0;
  req.length = bytes;
  TH_RETURN_IF_ERROR(conn->Read(req, {&v, 1}, Deadline::AfterMs(10000)));
  return calls->load();
}

// Flags of the two-process benchmarks (pair, local).
struct TwoProcessFlags {
  uint64_t bytes = 0;
  uint64_t chunk_bytes = 0;
  uint64_t repeat = 3;
  uint64_t connections = 4;
  bool data_tls = false;  // pair only
  // The holder's published memory, the reader's destination and the
  // memcpy's buffers alike.
  HostMemory host_memory = HostMemory::kHugePages;
};

// One line naming the memory a two-process benchmark moves, so that its
// output says which of the two kinds its figures are of.
void PrintHostMemory(HostMemory memory) {
  const std::string mode = TransparentHugePageMode();
  std::printf("host memory: %s (%s; the kernel's THP mode: %s)\n",
              HostMemoryName(memory),
              memory == HostMemory::kPlain
                  ? "new[]"
                  : "HostBuffer, madvise(MADV_HUGEPAGE)",
              mode.empty() ? "unknown" : mode.c_str());
}

void AddHostMemoryOption(CLI::App* c, HostMemory* memory) {
  c->add_option_function<std::string>(
       "--host-memory",
       [memory](const std::string& v) {
         *memory = v == HostMemoryName(HostMemory::kPlain)
                       ? HostMemory::kPlain
                       : HostMemory::kHugePages;
       },
       "huge-pages: every buffer (the holder's, the reader's, memcpy's) a "
       "HostBuffer, as TensorHub allocates them; plain: new[], as most "
       "programs do (huge pages only where the kernel's THP mode is "
       "'always')")
      ->check(CLI::IsMember({HostMemoryName(HostMemory::kHugePages),
                             HostMemoryName(HostMemory::kPlain)}))
      ->default_str(HostMemoryName(HostMemory::kHugePages));
}

void AddTwoProcessFlags(CLI::App* c, TwoProcessFlags* f) {
  AddBytesOption(c, "--bytes", &f->bytes, "1GiB", "bytes the holder publishes")
      ->check(CLI::Range(uint64_t{4096}, uint64_t{64} << 30));
  AddBytesOption(c, "--chunk-bytes", &f->chunk_bytes, "4MiB",
                 "the unit of transfer");
  c->add_option("--repeat", f->repeat, "runs (the best of each is reported)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{100}))
      ->capture_default_str();
  c->add_option("--connections", f->connections, "parallel streams")
      ->check(CLI::Range(uint64_t{1}, uint64_t{64}))
      ->capture_default_str();
  AddHostMemoryOption(c, &f->host_memory);
}

struct HubAndHolder {
  std::unique_ptr<Hub> hub;
  std::optional<Subprocess> holder;  // set once started
  std::string digest;                // of the bytes the holder published
  // With data-plane TLS (bench pair --data-tls): the certificates (the hub
  // runs TLS too, so every client needs the CA), and a second holder of the
  // same bytes under kTlsModel, serving over TLS.
  std::unique_ptr<tls::ThrowawayPki> pki;
  std::optional<Subprocess> tls_holder;
};

// The TLS files of a worker of `pki` (its hub address's host is 127.0.0.1).
void UseTls(const tls::ThrowawayPki& pki, ClientOptions* o) {
  o->tls_ca_file = pki.ca;
  o->tls_cert_file = pki.worker_cert;
  o->tls_key_file = pki.worker_key;
}

Result<Subprocess> StartHolder(const std::string& hub, uint64_t bytes,
                               uint64_t chunk, HostMemory memory,
                               const std::string& holder_log,
                               const tls::ThrowawayPki* pki, bool data_tls,
                               std::string* digest) {
  std::vector<std::string> args = {"bench",         "_holder",
                                   "--hub",         hub,
                                   "--bytes",       std::to_string(bytes),
                                   "--chunk-bytes", std::to_string(chunk),
                                   "--host-memory", HostMemoryName(memory)};
  if (pki != nullptr) {
    for (const std::string& a :
         {std::string("--tls-ca"), pki->ca, std::string("--tls-cert"),
          pki->worker_cert, std::string("--tls-key"), pki->worker_key}) {
      args.push_back(a);
    }
  }
  if (data_tls) {
    args.push_back("--data-tls");
    args.push_back("--model");
    args.push_back(kTlsModel);
  }
  TH_ASSIGN_OR_RETURN(Subprocess holder,
                      Subprocess::Spawn(args, {"TENSORHUB_LOG=" + holder_log}));
  TH_ASSIGN_OR_RETURN(std::string ready,
                      holder.ReadLine(Deadline::AfterMs(120000)));
  if (ready.rfind("ready ", 0) != 0) return Internal("holder: " + ready);
  *digest = ready.substr(6);
  return holder;
}

// An embedded hub and a holder process that has published `bytes`; with
// `data_tls`, the hub on TLS and a second holder serving over TLS.
Result<HubAndHolder> StartHubAndHolder(uint64_t bytes, uint64_t chunk,
                                       HostMemory memory,
                                       const std::string& holder_log,
                                       bool data_tls = false) {
  HubAndHolder out;
  HubOptions ho;
  ho.listen_address = "127.0.0.1:0";
  if (data_tls) {
    TH_ASSIGN_OR_RETURN(out.pki, tls::ThrowawayPki::Make());
    ho.tls_cert_file = out.pki->hub_cert;
    ho.tls_key_file = out.pki->hub_key;
  }
  TH_ASSIGN_OR_RETURN(out.hub, Hub::Start(ho));
  TH_ASSIGN_OR_RETURN(
      Subprocess holder,
      StartHolder(out.hub->address(), bytes, chunk, memory, holder_log,
                  out.pki.get(), false, &out.digest));
  out.holder.emplace(std::move(holder));
  if (data_tls) {
    std::string digest;
    TH_ASSIGN_OR_RETURN(Subprocess tls_holder,
                        StartHolder(out.hub->address(), bytes, chunk, memory,
                                    holder_log, out.pki.get(), true, &digest));
    out.tls_holder.emplace(std::move(tls_holder));
    if (digest != out.digest) return Internal("the two holders differ");
  }
  return out;
}

// The holder side of `bench pair`, as its own process.
struct HolderFlags {
  std::string hub;
  uint64_t bytes = 0;
  uint64_t chunk_bytes = 4 << 20;
  std::string model = kModel;
  // bench pair --data-tls: the throwaway CA's files, and TLS on the data
  // plane for the second holder.
  std::string tls_ca, tls_cert, tls_key;
  bool data_tls = false;
  HostMemory host_memory = HostMemory::kHugePages;
};

int RunBenchHolder(const HolderFlags& f) {
  SyntheticModel model(FlatLayout(f.bytes), f.host_memory);
  model.Fill(1);
  ClientOptions o;
  o.hub_address = f.hub;
  o.name = "bench-holder";
  o.tls_ca_file = f.tls_ca;
  o.tls_cert_file = f.tls_cert;
  o.tls_key_file = f.tls_key;
  o.data_tls = f.data_tls;
  auto client = Client::Connect(o);
  if (!client.ok()) return Fail(client.status());
  PublishOptions po;
  po.chunk_bytes = f.chunk_bytes;
  Status s = (*client)->Publish(f.model, Version(1), model.tensors(), po);
  if (!s.ok()) return Fail(s);
  Reply("ready " + Hex(model.Digest()));
  std::string line;
  std::getline(std::cin, line);  // any line, or EOF, ends the holder
  return 0;
}

int RunBenchPair(const TwoProcessFlags& f) {
  SetLogLevel(LogLevel::kWarn);
  // This benchmark measures the TCP data plane against a raw socket pair:
  // switch the intra-host path off for both processes (see bench local).
  ::setenv("TENSORHUB_NO_CMA", "1", 1);

  auto pair = StartHubAndHolder(f.bytes, f.chunk_bytes, f.host_memory, "warn",
                                f.data_tls);
  if (!pair.ok()) return Fail(pair.status());
  HubAndHolder& hh = *pair;

  SyntheticModel dest(FlatLayout(f.bytes), f.host_memory);
  ClientOptions o;
  o.hub_address = hh.hub->address();
  o.name = "bench-reader";
  if (hh.pki) UseTls(*hh.pki, &o);
  auto reader = Client::Connect(o);
  if (!reader.ok()) return Fail(reader.status());
  std::unique_ptr<Client> tls_reader;
  std::shared_ptr<const tls::Context> raw_tls;  // for the raw TLS pair
  if (f.data_tls) {
    tls::PemFiles files;
    files.cert = hh.pki->worker_cert;
    files.key = hh.pki->worker_key;
    files.ca = hh.pki->ca;
    auto creds = tls::LoadCredentials(files);
    if (!creds.ok()) return Fail(creds.status());
    auto ctx = tls::Context::ForDataPlane(*creds);
    if (!ctx.ok()) return Fail(ctx.status());
    raw_tls = *ctx;
    o.name = "bench-reader-tls";
    o.data_tls = true;
    auto r = Client::Connect(o);
    if (!r.ok()) return Fail(r.status().WithContext("TLS reader"));
    tls_reader = std::move(r).value();
  }
  SyntheticModel src(FlatLayout(f.bytes), f.host_memory);
  src.Fill(2);
  auto* src_base = static_cast<const uint8_t*>(src.tensors()[0].data);
  auto* dst_base = static_cast<uint8_t*>(dest.tensors()[0].data);

  std::printf(
      "bench pair: TCP data plane, %s, chunks of %s, %llu repeats (best of "
      "each)\n",
      FormatBytes(f.bytes).c_str(), FormatBytes(f.chunk_bytes).c_str(),
      static_cast<unsigned long long>(f.repeat));
  PrintHostMemory(f.host_memory);
  if (f.data_tls) {
    tls::KernelTlsSupport k = tls::KernelTls();
    std::printf(
        "data-plane TLS: mutual TLS 1.3 (throwaway CA made with openssl); "
        "kernel TLS %s\n",
        k.available ? "available on this kernel"
                    : ("not available: " + k.why).c_str());
  }
  const std::string holder_digest = hh.digest;
  auto fetch = [&](Client& c, const char* model,
                   FetchStats* stats) -> Result<double> {
    FetchOptions fo;
    fo.serve = false;
    fo.connections = static_cast<int>(f.connections);
    std::memset(dst_base, 0, dest.total_bytes());  // a fetch must write it
    auto st = c.Fetch(model, Version(1), dest.tensors(), fo);
    if (!st.ok()) return st.status();
    if (holder_digest != Hex(dest.Digest()))
      return DataLoss("fetched bytes differ from the holder's");
    *stats = *st;
    return st->bytes / st->seconds / 1e9;
  };
  double th = 0, tls_gbps = 0, raw1 = 0, rawn = 0, mc = 0, raw_tls1 = 0;
  FetchStats tls_stats;
  for (uint64_t r = 0; r < f.repeat; ++r) {
    FetchStats st;
    auto gbps = fetch(**reader, kModel, &st);
    if (!gbps.ok()) return Fail(gbps.status());
    th = std::max(th, *gbps);
    double tls_run = 0, raw_tls_run = 0;
    if (tls_reader) {
      auto t = fetch(*tls_reader, kTlsModel, &tls_stats);
      if (!t.ok()) return Fail(t.status().WithContext("TLS fetch"));
      if (tls_stats.tls_connections == 0)
        return Fail(Internal("the TLS fetch opened no TLS connection"));
      tls_run = *t;
      tls_gbps = std::max(tls_gbps, tls_run);
      auto rt = RawTls(*raw_tls, src_base, dst_base, src.total_bytes());
      if (!rt.ok()) return Fail(rt.status());
      raw_tls_run = *rt;
      raw_tls1 = std::max(raw_tls1, raw_tls_run);
    }
    auto a = RawTcp(src_base, dst_base, src.total_bytes(), 1);
    if (!a.ok()) return Fail(a.status());
    raw1 = std::max(raw1, *a);
    auto b = RawTcp(src_base, dst_base, src.total_bytes(),
                    static_cast<int>(f.connections));
    if (!b.ok()) return Fail(b.status());
    rawn = std::max(rawn, *b);
    mc = std::max(mc, Memcpy(src_base, dst_base, src.total_bytes()));
    char tls_part[96] = "";
    if (tls_reader) {
      std::snprintf(tls_part, sizeof(tls_part),
                    ", tensorhub TLS %.2f GB/s, raw TLS x1 %.2f GB/s", tls_run,
                    raw_tls_run);
    }
    std::printf(
        "  run %llu: tensorhub %.2f GB/s%s, raw TCP x1 %.2f GB/s, raw TCP "
        "x%llu %.2f GB/s, memcpy %.2f GB/s\n",
        static_cast<unsigned long long>(r + 1), *gbps, tls_part, *a,
        static_cast<unsigned long long>(f.connections), *b, mc);
  }
  (void)hh.holder->Send("quit");
  hh.holder->Stop(5000);
  if (hh.tls_holder) {
    (void)hh.tls_holder->Send("quit");
    hh.tls_holder->Stop(5000);
  }
  std::printf("\n%-48s %8s %10s\n", "", "GB/s", "tensorhub/x");
  std::printf("%-48s %8.2f %10s\n", "tensorhub fetch (verified, 1 holder)", th,
              "");
  if (tls_reader) {
    char label[96];
    std::snprintf(label, sizeof(label),
                  "tensorhub fetch over TLS (%s kTLS recv)",
                  tls_stats.kernel_tls_connections > 0 ? "with" : "no");
    std::printf("%-48s %8.2f %10.2f\n", label, tls_gbps, th / tls_gbps);
    std::printf("%-48s %8.2f %10.2f\n",
                "raw loopback TLS pair (OpenSSL), 1 stream", raw_tls1,
                th / raw_tls1);
  }
  std::printf("%-48s %8.2f %10.2f\n", "raw loopback TCP socket pair, 1 stream",
              raw1, th / raw1);
  char label[64];
  std::snprintf(label, sizeof(label), "raw loopback TCP, %llu streams",
                static_cast<unsigned long long>(f.connections));
  std::printf("%-48s %8.2f %10.2f\n", label, rawn, th / rawn);
  std::printf("%-48s %8.2f %10.2f\n", "memcpy (same process)", mc, th / mc);
  std::printf("\nratio vs raw socket pair: %.2f (target >= 0.90)\n", th / raw1);
  if (tls_reader) {
    std::printf(
        "TLS fetch / plain TCP fetch: %.2f; TLS fetch / raw TLS pair: %.2f; "
        "raw TLS pair / raw TCP pair: %.2f (%u TLS connections, %u decrypted "
        "by the kernel)\n",
        tls_gbps / th, tls_gbps / raw_tls1, raw_tls1 / raw1,
        tls_stats.tls_connections, tls_stats.kernel_tls_connections);
  }
  return 0;
}

int RunBenchLocal(const TwoProcessFlags& f) {
  Result<transport::TcpTransportOptions> env =
      transport::TcpTransportOptions::FromEnv();
  if (!env.ok()) return Fail(env.status());
  if (!env->local_reads) {
    return Fail(FailedPrecondition(
        "TENSORHUB_NO_CMA=1 is set: unset it, this benchmark sets it itself"));
  }
  SetLogLevel(LogLevel::kWarn);

  auto pair = StartHubAndHolder(f.bytes, f.chunk_bytes, f.host_memory, "info");
  if (!pair.ok()) return Fail(pair.status());
  auto& hub = pair->hub;
  Subprocess& holder = *pair->holder;
  const std::string& digest = pair->digest;

  ClientOptions o;
  o.hub_address = hub->address();
  o.name = "bench-reader-local";
  auto local_reader = Client::Connect(o);
  if (!local_reader.ok()) return Fail(local_reader.status());
  // The transport reads the switch when the client is made.
  ::setenv("TENSORHUB_NO_CMA", "1", 1);
  o.name = "bench-reader-tcp";
  auto tcp_reader = Client::Connect(o);
  ::unsetenv("TENSORHUB_NO_CMA");
  if (!tcp_reader.ok()) return Fail(tcp_reader.status());

  auto info = (*local_reader)->Describe(kModel, Version(1));
  if (!info.ok()) return Fail(info.status());
  if (info->holders.empty())
    return Fail(Internal("the holder is not registered"));
  auto probe = ProbeLocalPath(info->holders[0].data_address,
                              std::min<uint64_t>(f.chunk_bytes, f.bytes));
  if (!probe.ok()) return Fail(probe.status().WithContext("probe read"));

  SyntheticModel dest(FlatLayout(f.bytes), f.host_memory);
  SyntheticModel src(FlatLayout(f.bytes), f.host_memory);
  src.Fill(2);
  auto* src_base = static_cast<const uint8_t*>(src.tensors()[0].data);
  auto* dst_base = static_cast<uint8_t*>(dest.tensors()[0].data);
  const uint64_t total = src.total_bytes();  // one contiguous buffer

  std::printf(
      "bench local: %s, chunks of %s, %llu connections, %llu repeats (best of "
      "each)\n",
      FormatBytes(f.bytes).c_str(), FormatBytes(f.chunk_bytes).c_str(),
      static_cast<unsigned long long>(f.connections),
      static_cast<unsigned long long>(f.repeat));
  PrintHostMemory(f.host_memory);
  std::printf(
      "path check: a %s probe read from the holder took %d process_vm_readv "
      "calls%s\n",
      FormatBytes(std::min<uint64_t>(f.chunk_bytes, f.bytes)).c_str(), *probe,
      *probe > 0 ? "" : " (NOT the intra-host path: see the holder's log)");
  double local = 0, tcp = 0, mc = 0, raw = 0;
  std::vector<double> ratios;  // intra-host / memcpy, per run
  // A copy: a lambda may not capture a structured binding before C++20's
  // P1091 (clang 14 rejects it).
  const std::string holder_digest = digest;
  auto fetch = [&](Client& c) -> Result<double> {
    FetchOptions fo;
    fo.serve = false;
    fo.connections = static_cast<int>(f.connections);
    std::memset(dst_base, 0, total);  // so a fetch that wrote nothing fails
    auto st = c.Fetch(kModel, Version(1), dest.tensors(), fo);
    if (!st.ok()) return st.status();
    if (holder_digest != Hex(dest.Digest())) {
      return DataLoss("fetched bytes differ from the holder's");
    }
    return st->bytes / st->seconds / 1e9;
  };
  for (uint64_t r = 0; r < f.repeat; ++r) {
    auto a = fetch(**local_reader);
    if (!a.ok()) return Fail(a.status().WithContext("intra-host fetch"));
    auto b = fetch(**tcp_reader);
    if (!b.ok()) return Fail(b.status().WithContext("TCP fetch"));
    double m = Memcpy(src_base, dst_base, total);
    auto c = RawCma(src_base, dst_base, total);
    if (!c.ok()) return Fail(c.status());
    local = std::max(local, *a);
    tcp = std::max(tcp, *b);
    mc = std::max(mc, m);
    raw = std::max(raw, *c);
    ratios.push_back(*a / m);
    std::printf(
        "  run %llu: intra-host %.2f GB/s, TCP %.2f GB/s, memcpy %.2f GB/s, "
        "raw process_vm_readv %.2f GB/s (intra-host/memcpy %.2f)\n",
        static_cast<unsigned long long>(r + 1), *a, *b, m, *c, *a / m);
  }
  (void)holder.Send("quit");
  holder.Stop(5000);
  std::printf("\n%-52s %8s %10s\n", "", "GB/s", "x memcpy");
  std::printf("%-52s %8.2f %10.2f\n",
              "tensorhub fetch, intra-host (verified, 1 holder)", local,
              local / mc);
  std::printf("%-52s %8.2f %10.2f\n",
              "tensorhub fetch, forced TCP (TENSORHUB_NO_CMA=1)", tcp,
              tcp / mc);
  std::printf("%-52s %8.2f %10.2f\n",
              "raw process_vm_readv, 1 thread, 1 MiB segments", raw, raw / mc);
  std::printf("%-52s %8.2f %10.2f\n", "memcpy (same process, 1 thread)", mc,
              1.0);
  std::sort(ratios.begin(), ratios.end());
  std::printf(
      "\nintra-host / memcpy: %.2f best vs best, %.2f median of runs (target "
      ">= 0.80); intra-host / TCP: %.2f\n",
      local / mc, ratios[ratios.size() / 2], local / tcp);
  return 0;
}

// UCX's own benchmark: `ucx_perftest -t TEST` (ucp_am_bw, ucp_get, tag_bw) of
// one message of `bytes` between a server and a client process on this host,
// `iters` times (one warm-up), with the environment's UCX_TLS; the overall
// bandwidth in GB/s (1e9 bytes).
Result<double> UcxPerftestGbps(const std::string& test, uint64_t bytes,
                               int iters) {
  TH_ASSIGN_OR_RETURN(int port, FreeLoopbackPort());
  const std::vector<std::string> args = {
      "-t", test, "-s", std::to_string(bytes), "-n", std::to_string(iters),
      "-w", "1",  "-p", std::to_string(port)};
  std::vector<char*> argv = {const_cast<char*>("ucx_perftest")};
  for (const std::string& a : args)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t server = ::fork();
  if (server < 0) return Internal("fork: " + std::string(std::strerror(errno)));
  if (server == 0) {
    int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) {
      ::dup2(null, 1);
      ::dup2(null, 2);
    }
    ::execvp("ucx_perftest", argv.data());
    ::_exit(127);
  }
  auto reap = [server](bool kill) {
    if (kill) ::kill(server, SIGKILL);
    int status = 0;
    ::waitpid(server, &status, 0);
    return status;
  };
  std::string cmd = "ucx_perftest 127.0.0.1";
  for (const std::string& a : args) cmd += " " + a;
  cmd += " 2>&1";
  // The server listens once it has started: the client retries until then.
  const Deadline deadline = Deadline::AfterMs(30000);
  std::string out;
  while (true) {
    int exited = 0;
    if (::waitpid(server, &exited, WNOHANG) == server) {
      return FailedPrecondition(
          "ucx_perftest (the server) exited with status " +
          std::to_string(WEXITSTATUS(exited)) +
          (WEXITSTATUS(exited) == 127
               ? ": not installed (apt-get install ucx-utils)"
               : ""));
    }
    FILE* p = ::popen(cmd.c_str(), "r");
    if (p == nullptr) {
      reap(true);
      return Internal("popen ucx_perftest");
    }
    out.clear();
    char buf[512];
    while (std::fgets(buf, sizeof(buf), p) != nullptr) out += buf;
    ::pclose(p);
    if (out.find("Final:") != std::string::npos) break;
    if (deadline.expired()) {
      reap(true);
      return DeadlineExceeded(
          "ucx_perftest's client did not run within 30 s: " +
          out.substr(0, 400));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  reap(false);
  // Final: iters, latency 50%/avg/overall (us), bandwidth avg/overall
  // (MB/s, 2^20 bytes), message rate avg/overall. Read with strtod: a
  // column may say "inf".
  std::istringstream in(out.substr(out.find("Final:") + 6));
  double v[6] = {0};
  for (double& x : v) {
    std::string word;
    if (!(in >> word)) break;
    x = std::strtod(word.c_str(), nullptr);
  }
  if (!(v[5] > 0) || std::isinf(v[5])) {
    return Internal("cannot read ucx_perftest's result: " + out.substr(0, 400));
  }
  return v[5] * 1048576.0 / 1e9;
}

// What a process holds: open descriptors and resident memory, from /proc.
struct ProcessFootprint {
  uint64_t fds = 0;
  uint64_t rss_kib = 0;
};

Result<ProcessFootprint> Footprint(pid_t pid) {
  ProcessFootprint out;
  const std::string dir = "/proc/" + std::to_string(pid);
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(dir + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++out.fds;
  }
  if (ec) return Internal("cannot list " + dir + "/fd: " + ec.message());
  std::ifstream status(dir + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) out.rss_kib = std::stoull(line.substr(6));
  }
  if (out.rss_kib == 0) return Internal("no VmRSS in " + dir + "/status");
  return out;
}

// Samples a process's footprint every few milliseconds until destroyed and
// keeps the largest of each: what it held at its busiest, such as a holder
// with every reader's connection open.
class PeakFootprint {
 public:
  explicit PeakFootprint(pid_t pid)
      : thread_([this, pid] {
          while (!stop_.load()) {
            Result<ProcessFootprint> now = Footprint(pid);
            if (now.ok()) {
              peak_.fds = std::max(peak_.fds, now->fds);
              peak_.rss_kib = std::max(peak_.rss_kib, now->rss_kib);
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
          }
        }) {}
  ~PeakFootprint() { Stop(); }
  ProcessFootprint Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    return peak_;
  }

 private:
  std::atomic<bool> stop_{false};
  ProcessFootprint peak_;  // the sampling thread's until joined
  std::thread thread_;
};

int RunBenchUcx(const TwoProcessFlags& f) {
  SetLogLevel(LogLevel::kWarn);
  // The holder process inherits it: both ends serve and read over UCX only.
  ::setenv("TENSORHUB_TRANSPORTS", "ucx", 1);
  // On one host: read over UCX all the same (not TCP's same-host path).
  ::setenv("TENSORHUB_UCX_SAME_HOST", "1", 1);
  // Whatever wires UCX has here, RDMA or not (tcp, shared memory: wires
  // no hardware checks, docs/security.md), unless the caller said
  // TENSORHUB_UCX_EMULATED_GETS=refuse: the benchmark's processes are its own.
  ::setenv("TENSORHUB_UCX_EMULATED_GETS", "allow", 0);
  auto pair = StartHubAndHolder(f.bytes, f.chunk_bytes, f.host_memory, "warn");
  if (!pair.ok()) return Fail(pair.status());
  HubAndHolder& hh = *pair;
  SyntheticModel dest(FlatLayout(f.bytes), f.host_memory);
  ClientOptions o;
  o.hub_address = hh.hub->address();
  o.name = "bench-reader-ucx";
  o.transports = {"ucx"};
  o.ucx_same_host = true;
  auto reader = Client::Connect(o);
  if (!reader.ok()) return Fail(reader.status());
  SyntheticModel src(FlatLayout(f.bytes), f.host_memory);
  src.Fill(2);
  auto* src_base = static_cast<const uint8_t*>(src.tensors()[0].data);
  auto* dst_base = static_cast<uint8_t*>(dest.tensors()[0].data);
  const char* ucx_tls = std::getenv("UCX_TLS");
  std::printf(
      "bench ucx: UCX data plane (UCX_TLS=%s), %s, chunks of %s, %llu "
      "streams, %llu repeats (best of each)\n",
      ucx_tls != nullptr ? ucx_tls : "(unset: all)",
      FormatBytes(f.bytes).c_str(), FormatBytes(f.chunk_bytes).c_str(),
      static_cast<unsigned long long>(f.connections),
      static_cast<unsigned long long>(f.repeat));
  PrintHostMemory(f.host_memory);
  // Per round: the fetch, then UCX's own benchmark of the same bytes in one
  // message with the same UCX_TLS: as active messages (ucp_am_bw: the
  // operation this data plane uses since 2026-11-28), as RMA reads
  // (ucp_get: what it used before, of buffers UCX allocated itself, which on
  // one host it may map through shared memory; memory a user allocated,
  // such as published tensors, cannot take that path in UCX 1.13) and as
  // tagged messages (tag_bw: rendezvous).
  std::vector<double> ths, tags, gets, ams;
  double mc = 0, verify_share = 0;
  // The holder idle (published, no reader connected), then at its busiest
  // during each fetch: what its UCX reader connections cost it.
  Result<ProcessFootprint> idle = Footprint(hh.holder->pid());
  if (!idle.ok()) return Fail(idle.status().WithContext("the holder"));
  ProcessFootprint busiest = *idle;
  for (uint64_t r = 0; r < f.repeat; ++r) {
    FetchOptions fo;
    fo.serve = false;
    fo.connections = static_cast<int>(f.connections);
    std::memset(dst_base, 0, dest.total_bytes());
    PeakFootprint peak(hh.holder->pid());
    auto st = (*reader)->Fetch(kModel, Version(1), dest.tensors(), fo);
    const ProcessFootprint seen = peak.Stop();
    busiest.fds = std::max(busiest.fds, seen.fds);
    busiest.rss_kib = std::max(busiest.rss_kib, seen.rss_kib);
    if (!st.ok()) return Fail(st.status());
    if (hh.digest != Hex(dest.Digest())) {
      return Fail(DataLoss("fetched bytes differ from the holder's"));
    }
    for (const FetchSourceStats& s : st->sources) {
      if (s.transport != "ucx") {
        return Fail(FailedPrecondition(
            "a source was read over " + s.transport +
            ", not ucx: this build or machine has no UCX (TH_UCX needs "
            "libucx-dev at build time; the log's 'data plane:' line says "
            "why)"));
      }
    }
    const double gbps = st->bytes / st->seconds / 1e9;
    if (ths.empty() || gbps > *std::max_element(ths.begin(), ths.end())) {
      verify_share = st->verify_seconds / st->seconds;
    }
    ths.push_back(gbps);
    // The same bytes in one message, so that it, like the fetch, is bound by
    // memory rather than served from the cache.
    auto tag = UcxPerftestGbps("tag_bw", f.bytes, 3);
    if (!tag.ok()) return Fail(tag.status().WithContext("ucx_perftest"));
    tags.push_back(*tag);
    auto get = UcxPerftestGbps("ucp_get", f.bytes, 3);
    if (!get.ok()) return Fail(get.status().WithContext("ucx_perftest"));
    gets.push_back(*get);
    auto am = UcxPerftestGbps("ucp_am_bw", f.bytes, 3);
    if (!am.ok()) return Fail(am.status().WithContext("ucx_perftest"));
    ams.push_back(*am);
    mc = std::max(mc, Memcpy(src_base, dst_base, src.total_bytes()));
    std::printf(
        "  run %llu: tensorhub over ucx %.2f GB/s (verify %.0f%% of it, "
        "first chunk after %.0f ms), ucx_perftest ucp_am_bw %.2f GB/s, "
        "tag_bw %.2f GB/s, ucp_get %.2f GB/s\n",
        static_cast<unsigned long long>(r + 1), gbps,
        100 * st->verify_seconds / st->seconds,
        1000 * (st->resolve_seconds + st->schedule_seconds +
                st->first_byte_seconds),
        *am, *tag, *get);
  }
  (void)hh.holder->Send("quit");
  hh.holder->Stop(5000);
  auto best = [](const std::vector<double>& v) {
    return *std::max_element(v.begin(), v.end());
  };
  auto range = [](const std::vector<double>& v) {
    char b[64];
    std::snprintf(b, sizeof(b), "%.2f-%.2f",
                  *std::min_element(v.begin(), v.end()),
                  *std::max_element(v.begin(), v.end()));
    return std::string(b);
  };
  // Both sides of this VM's loopback swing between runs (ucx_perftest's
  // own gets by up to 1.7x): the median is printed beside the best.
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  };
  const double th = best(ths), tag = best(tags), get = best(gets),
               am = best(ams);
  std::printf("\n%-50s %8s %8s %12s %10s\n", "of all runs (GB/s)", "best",
              "median", "range", "tensorhub/x");
  std::printf("%-50s %8.2f %8.2f %12s %10s\n",
              "tensorhub fetch over ucx (every chunk verified)", th,
              median(ths), range(ths).c_str(), "");
  std::printf("%-50s %8.2f %8.2f %12s %10.2f\n",
              "ucx_perftest ucp_am_bw, same bytes (active msgs)", am,
              median(ams), range(ams).c_str(), th / am);
  std::printf("%-50s %8.2f %8.2f %12s %10.2f\n",
              "ucx_perftest ucp_get, same bytes (UCX's buffers)", get,
              median(gets), range(gets).c_str(), th / get);
  std::printf("%-50s %8.2f %8.2f %12s %10.2f\n",
              "ucx_perftest tag_bw, same bytes (rendezvous)", tag, median(tags),
              range(tags).c_str(), th / tag);
  std::printf("%-50s %8.2f %8s %12s %10.2f\n", "memcpy (same process)", mc, "",
              "", th / mc);
  std::printf(
      "\nratio vs ucx_perftest ucp_am_bw: %.2f best to best, %.2f median to "
      "median (target >= 0.90); vs ucp_get: %.2f; vs tag_bw: %.2f; "
      "verification took %.0f%% of the best fetch\n",
      th / am, median(ths) / median(ams), th / get, th / tag,
      100 * verify_share);
  // Each reader connection has its own UCX worker in the holder
  // (docs/design.md, UCX data plane): its sockets and, where UCX_TLS allows
  // shared memory, its shared-memory queues.
  const double n = static_cast<double>(f.connections);
  const auto more = [](uint64_t a, uint64_t b) {
    return a > b ? static_cast<double>(a - b) : 0.0;
  };
  std::printf("holder footprint: idle %" PRIu64
              " fds, %.1f MiB resident; serving %" PRIu64
              " connections at most %" PRIu64
              " fds, %.1f MiB: %.1f fds and %.0f KiB "
              "per connection (sampled every 5 ms)\n",
              idle->fds, idle->rss_kib / 1024.0, f.connections, busiest.fds,
              busiest.rss_kib / 1024.0, more(busiest.fds, idle->fds) / n,
              more(busiest.rss_kib, idle->rss_kib) / n);
  return 0;
}

}  // namespace

void AddBenchCommands(CommandLine& cl) {
  CLI::App* bench = cl.AddGroup("bench",
                                "bench pair | bench local | bench ucx: a fetch "
                                "beside the limits measured "
                                "in the same run");
  auto pair = std::make_shared<TwoProcessFlags>();
  CLI::App* pc = cl.Add(
      "pair",
      "a holder and a reader process on loopback TCP, beside a raw "
      "socket pair and memcpy",
      [pair] { return RunBenchPair(*pair); }, bench);
  AddTwoProcessFlags(pc, pair.get());
  pc->add_flag("--data-tls", pair->data_tls,
               "also fetch from a holder serving over data-plane TLS "
               "(certificates from a throwaway CA made with openssl), beside "
               "a raw TLS pair");
  auto local = std::make_shared<TwoProcessFlags>();
  AddTwoProcessFlags(
      cl.Add(
          "local",
          "the same on the intra-host path (cross-memory attach), beside "
          "TCP, process_vm_readv and memcpy",
          [local] { return RunBenchLocal(*local); }, bench),
      local.get());
  auto ucx = std::make_shared<TwoProcessFlags>();
  AddTwoProcessFlags(
      cl.Add(
          "ucx",
          "the same over the UCX data plane, beside UCX's ucx_perftest "
          "(ucp_am_bw, ucp_get, tag_bw of the same bytes, the same UCX_TLS) "
          "and "
          "memcpy; over whatever wires UCX has here "
          "(TENSORHUB_UCX_EMULATED_GETS=allow unless set to refuse)",
          [ucx] { return RunBenchUcx(*ucx); }, bench),
      ucx.get());
  auto h = std::make_shared<HolderFlags>();
  CLI::App* c = cl.Add(
      "_holder", "the holder process of bench pair|local",
      [h] { return RunBenchHolder(*h); }, bench);
  c->add_option("--hub", h->hub)->required();
  c->add_option("--bytes", h->bytes)->required();
  c->add_option("--chunk-bytes", h->chunk_bytes);
  c->add_option("--model", h->model);
  c->add_option("--tls-ca", h->tls_ca);
  c->add_option("--tls-cert", h->tls_cert);
  c->add_option("--tls-key", h->tls_key);
  c->add_flag("--data-tls", h->data_tls);
  AddHostMemoryOption(c, &h->host_memory);
  for (const char* moved :
       {"hub", "fanout", "workload", "_trainer", "_reader"}) {
    cl.AddAnyArgs(
        moved, [moved] { return MovedToLab(std::string("bench ") + moved); },
        bench);
  }
}

}  // namespace tensorhub::cli
