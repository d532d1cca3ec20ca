// Device memory on the data plane, beside the limits measured in the same
// run: same-host device-to-device reads (CUDA IPC, verified by the device
// checksum) beside cudaMemcpy device to device, and reads staged through
// pinned host memory beside cudaMemcpy between the device and pinned
// memory, and beside a raw loopback TCP socket with as many streams. The
// holder is another process (tests/gpu_roles.h "serve"). Then a model-like
// mix of 300 tensors (4 KiB to 200 MiB, each its own allocation) fetched
// device to device by CUDA IPC, one read per tensor (per --chunk piece),
// beside cudaMemcpy of the same tensors one by one; and the time of one
// 4 KiB read, the per-read overhead.
//
//   gpu_bench [--bytes 1GiB] [--chunk 64MiB] [--streams 4] [--reps 3]
//             [--no-mix]
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <span>
#include <thread>

#include "cli_util.h"
#include "common/deadline.h"
#include "cuda/device.h"
#include "gpu_roles.h"
#include "subprocess.h"
#include "transport/tcp/socket_util.h"
#include "transport/tcp/tcp_transport.h"

namespace tensorhub::testing {
namespace {

// The value, or `fallback` if it failed.
template <typename T, typename U>
T OrElse(Result<T> r, U fallback) {
  return r.ok() ? std::move(r).value() : T(std::move(fallback));
}

double Seconds(SteadyClock::time_point t0) {
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

Status Check(const Status& s) {
  if (!s.ok()) std::fprintf(stderr, "%s\n", s.ToString().c_str());
  return s;
}

// Best GB/s of `reps` runs of fn (which moves `bytes`).
template <typename Fn>
Result<double> Best(int reps, uint64_t bytes, Fn&& fn) {
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = SteadyClock::now();
    TH_RETURN_IF_ERROR(fn());
    best = std::max(best, bytes / Seconds(t0) / 1e9);
  }
  return best;
}

// One read: `length` bytes at `offset` of the holder's part, into `dest`.
struct ReadOp {
  uint64_t offset = 0;
  uint64_t length = 0;
  uint8_t* dest = nullptr;
};

// Reads of [0, bytes) of the part into dest + offset, `chunk` bytes each.
std::vector<ReadOp> ChunkReads(uint8_t* dest, uint64_t bytes, uint64_t chunk) {
  std::vector<ReadOp> reads;
  for (uint64_t off = 0; off < bytes; off += chunk) {
    reads.push_back({off, std::min(chunk, bytes - off), dest + off});
  }
  return reads;
}

// Reads of tensors of `sizes`, laid end to end in the part, each into its
// own dests[i]: one read per tensor, or per `chunk` piece of a larger one
// (as a client fetching into its own tensors reads).
std::vector<ReadOp> TensorReads(std::span<const uint64_t> sizes,
                                std::span<uint8_t* const> dests,
                                uint64_t chunk) {
  std::vector<ReadOp> reads;
  uint64_t base = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    for (uint64_t off = 0; off < sizes[i]; off += chunk) {
      reads.push_back(
          {base + off, std::min(chunk, sizes[i] - off), dests[i] + off});
    }
    base += sizes[i];
  }
  return reads;
}

using Conns = std::vector<std::unique_ptr<transport::Connection>>;

// Runs `reads` over conns->size() connections in parallel, each taking the
// next read not taken. A null connection is opened first (in its thread);
// the connections stay open in *conns for the caller to reuse or drop.
Status ParallelRead(transport::Transport& t, const std::string& addr,
                    uint64_t epoch, std::span<const ReadOp> reads, bool device,
                    std::optional<ChunkChecksum> verify, Conns* conns) {
  std::atomic<size_t> next{0};
  std::vector<Status> errors(conns->size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < conns->size(); ++i) {
    threads.emplace_back([&, i] {
      std::unique_ptr<transport::Connection>& conn = (*conns)[i];
      if (conn == nullptr) {
        auto c = t.Connect(addr, Deadline::AfterMs(5000));
        if (!c.ok()) {
          errors[i] = c.status();
          return;
        }
        conn = std::move(c).value();
      }
      while (true) {
        size_t k = next.fetch_add(1);
        if (k >= reads.size()) return;
        const wire::ReadRequest req =
            ServedRead(epoch, reads[k].offset, reads[k].length);
        iovec v{reads[k].dest, req.length};
        transport::ReadChecksum sum{.kind = verify.value_or(ChunkChecksum{})};
        transport::ReadChecksum* want = verify ? &sum : nullptr;
        Status s =
            device ? conn->ReadDevice(req, {&v, 1}, 0, Deadline::AfterMs(60000),
                                      want)
                   : conn->Read(req, {&v, 1}, Deadline::AfterMs(60000), want);
        if (!s.ok()) {
          errors[i] = s;
          return;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const Status& s : errors) TH_RETURN_IF_ERROR(s);
  return Status::Ok();
}

// The raw socket limit: `bytes` from one host buffer into `dst` over
// `streams` loopback TCP connections at once, each carrying 1/streams of
// them, written and read whole. The sockets are set up as the data plane
// sets up its own (socket_util's ConnectTcp and TuneStream: TCP_NODELAY,
// non-blocking, polled with a deadline; it sets no SO_SNDBUF/SO_RCVBUF, so
// neither does this: the kernel's autotuning sizes both). Connections are
// opened once, before the reps. Best GB/s of `reps`.
Result<double> RawTcpLimit(int reps, uint8_t* dst, uint64_t bytes,
                           int streams) {
  std::vector<uint8_t> src(bytes, 0x5a);
  TH_ASSIGN_OR_RETURN(transport::Fd listener,
                      transport::ListenTcp("127.0.0.1:0", streams));
  TH_ASSIGN_OR_RETURN(std::string addr,
                      transport::LocalAddress(listener.get()));
  std::vector<transport::Fd> out, in;
  for (int i = 0; i < streams; ++i) {
    // The kernel completes the handshake from the backlog, so the accept
    // right after finds this connection (and no other) waiting.
    TH_ASSIGN_OR_RETURN(transport::Fd c,
                        transport::ConnectTcp(addr, Deadline::AfterMs(5000)));
    transport::Fd a(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!a.valid()) {
      return Internal(std::string("raw TCP limit: accept: ") +
                      std::strerror(errno));
    }
    transport::TuneStream(a.get());
    out.push_back(std::move(c));
    in.push_back(std::move(a));
  }
  return Best(reps, bytes, [&]() -> Status {
    std::vector<Status> errors(2 * streams);
    std::vector<std::thread> threads;
    for (int i = 0; i < streams; ++i) {
      const uint64_t begin = bytes * i / streams;
      const uint64_t end = bytes * (i + 1) / streams;
      threads.emplace_back([&, i, begin, end] {
        iovec v{src.data() + begin, end - begin};
        errors[2 * i] = transport::WriteAll(out[i].get(), {&v, 1},
                                            Deadline::AfterMs(60000));
        // A failed writer ends its reader now, not at its deadline.
        if (!errors[2 * i].ok()) ::shutdown(out[i].get(), SHUT_RDWR);
      });
      threads.emplace_back([&, i, begin, end] {
        iovec v{dst + begin, end - begin};
        errors[2 * i + 1] =
            transport::ReadAll(in[i].get(), {&v, 1}, Deadline::AfterMs(60000));
        if (!errors[2 * i + 1].ok()) ::shutdown(in[i].get(), SHUT_RDWR);
      });
    }
    for (auto& th : threads) th.join();
    for (const Status& s : errors) TH_RETURN_IF_ERROR(s);
    return Status::Ok();
  });
}

// The model-like mix: 300 tensor sizes from 4 KiB to 200 MiB, log-uniform
// from a fixed seed, multiples of 256 bytes, in a seeded order (small norms
// beside large projections, as a model's layers are); the first is 4 KiB
// (the per-read overhead reads it) and one is 200 MiB.
constexpr uint64_t kMixMinBytes = 4 << 10;
constexpr uint64_t kMixMaxBytes = uint64_t{200} << 20;
constexpr int kMixTensors = 300;
constexpr uint64_t kMixSeed = 31;
std::vector<uint64_t> MixSizes() {
  std::mt19937_64 rng(kMixSeed);
  std::uniform_real_distribution<double> log_bytes(
      std::log(static_cast<double>(kMixMinBytes)),
      std::log(static_cast<double>(kMixMaxBytes)));
  std::vector<uint64_t> sizes;
  for (int i = 0; i < kMixTensors; ++i) {
    uint64_t n = static_cast<uint64_t>(std::exp(log_bytes(rng))) / 256 * 256;
    sizes.push_back(std::clamp(n, kMixMinBytes, kMixMaxBytes));
  }
  sizes.front() = kMixMinBytes;
  sizes.back() = kMixMaxBytes;
  return sizes;
}

// Median of `samples`.
double Median(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

// A holder process (gpu_roles.h "serve") and where it serves.
struct Holder {
  cli::Subprocess proc;
  std::string addr;
  uint64_t epoch = 0;
};

// Starts one holder per entry of `flags` (each after "--role=serve"), all
// at once, and waits until every one says it is ready.
Result<std::vector<Holder>> StartHolders(
    const std::vector<std::vector<std::string>>& flags) {
  std::vector<cli::Subprocess> procs;
  for (const std::vector<std::string>& f : flags) {
    std::vector<std::string> args = {"--role=serve"};
    args.insert(args.end(), f.begin(), f.end());
    TH_ASSIGN_OR_RETURN(cli::Subprocess p,
                        cli::Subprocess::Spawn(args, {"TENSORHUB_LOG=warn"}));
    procs.push_back(std::move(p));
  }
  std::vector<Holder> holders;
  for (cli::Subprocess& p : procs) {
    auto line = p.ReadLine(Deadline::AfterMs(180000));
    if (!line.ok()) {
      return Internal("holder did not start: " + line.status().ToString());
    }
    TH_ASSIGN_OR_RETURN(ServeReady ready, ParseServeReady(*line));
    holders.push_back(Holder{std::move(p), ready.address, ready.epoch});
  }
  return holders;
}

void Quit(std::vector<Holder>& holders) {
  for (Holder& h : holders) (void)h.proc.Send("quit");
}

// "NAME  X GB/s  = Ax LIMIT[, Bx LIMIT2]": a row beside its limits.
struct Limit {
  double gbs = 0;
  const char* name = "";
};
void PrintRow(const std::string& name, double gbs,
              std::initializer_list<Limit> limits) {
  std::printf("%-46s %8.2f GB/s ", name.c_str(), gbs);
  const char* sep = " =";
  for (const Limit& l : limits) {
    std::printf("%s %.3fx %s", sep, gbs / l.gbs, l.name);
    sep = ",";
  }
  std::printf("\n");
}

// Best GB/s of reading `reads` (`total` bytes) from `from` over `streams`
// connections: new ones every rep, as a fetch opens them (so a CUDA IPC
// reader opens the holder's handles again), or with `warm` the same ones
// across the reps (the first rep opens them).
Result<double> MeasureReads(transport::Transport& t, const Holder& from,
                            std::span<const ReadOp> reads, uint64_t total,
                            int streams, int reps, bool device,
                            std::optional<ChunkChecksum> verify, bool warm) {
  Conns kept(streams);
  return Best(reps, total, [&] {
    Conns fresh(streams);
    return Check(ParallelRead(t, from.addr, from.epoch, reads, device, verify,
                              warm ? &kept : &fresh));
  });
}

constexpr int kUnmeasuredReads = 20;
constexpr int kMeasuredReads = 200;

// Median microseconds of fn over kMeasuredReads calls, after
// kUnmeasuredReads that are not measured (the first opens CUDA IPC handles).
template <typename Fn>
Result<double> MedianUs(Fn&& fn) {
  std::vector<double> us;
  for (int i = 0; i < kUnmeasuredReads + kMeasuredReads; ++i) {
    auto t0 = SteadyClock::now();
    TH_RETURN_IF_ERROR(fn());
    if (i >= kUnmeasuredReads) us.push_back(Seconds(t0) * 1e6);
  }
  return Median(std::move(us));
}

// The per-read overhead: one small read at offset 0 of each holder, one at
// a time on one connection kept open, beside a cudaMemcpy of as many bytes
// device to device and its synchronize.
Status PerReadOverhead(transport::Transport& t, const Holder& staged,
                       const Holder& direct, uint8_t* dest, const uint8_t* src,
                       uint64_t length, cuda::Stream& s,
                       std::optional<ChunkChecksum> verify) {
  TH_ASSIGN_OR_RETURN(double copy_us, MedianUs([&] {
                        TH_RETURN_IF_ERROR(s.CopyAsync(dest, src, length));
                        return s.Synchronize();
                      }));
  const std::string size = cli::FormatBytes(length);
  struct Row {
    const Holder* from;
    const char* policy;
    std::optional<ChunkChecksum> verify;
    const char* suffix;
  } rows[] = {{&staged, "staged", verify, ""},
              {&staged, "staged", std::nullopt, ", not verified"},
              {&direct, "direct", verify, ""},
              {&direct, "direct", std::nullopt, ", not verified"}};
  for (const Row& r : rows) {
    TH_ASSIGN_OR_RETURN(auto conn,
                        t.Connect(r.from->addr, Deadline::AfterMs(5000)));
    TH_ASSIGN_OR_RETURN(
        double read_us, MedianUs([&] {
          const wire::ReadRequest req = ServedRead(r.from->epoch, 0, length);
          iovec v{dest, length};
          transport::ReadChecksum sum{.kind =
                                          r.verify.value_or(ChunkChecksum{})};
          return Check(conn->ReadDevice(req, {&v, 1}, 0,
                                        Deadline::AfterMs(10000),
                                        r.verify ? &sum : nullptr));
        }));
    std::printf(
        "per-read overhead, CUDA IPC %s %s%s: %.1f us  = %.1fx cudaMemcpy "
        "D2D %s + sync (%.1f us), medians of %d\n",
        r.policy, size.c_str(), r.suffix, read_us, read_us / copy_us,
        size.c_str(), copy_us, kMeasuredReads);
  }
  return Status::Ok();
}

// Bytes of the mix's leading tensors (those that end in its first
// kCheckBytes) are compared with the holder's after each mix row: a cheap
// check that each read landed in its own tensor.
constexpr uint64_t kCheckBytes = uint64_t{64} << 20;

// The model-like mix (MixSizes), each tensor its own allocation on both
// sides, fetched device to device by CUDA IPC, beside cudaMemcpy of the
// same tensors one by one.
Status RunMix(int reps, uint64_t chunk, int streams, transport::Transport& t,
              cuda::Stream& s, std::optional<ChunkChecksum> verify) {
  const std::vector<uint64_t> sizes = MixSizes();
  uint64_t total = 0;
  size_t leading = 0;  // tensors that end within kCheckBytes
  std::string list;
  for (uint64_t n : sizes) {
    total += n;
    if (total <= kCheckBytes) ++leading;
    list += (list.empty() ? "" : ",") + std::to_string(n);
  }
  const uint64_t leading_bytes = [&] {
    uint64_t b = 0;
    for (size_t i = 0; i < leading; ++i) b += sizes[i];
    return b;
  }();
  std::printf(
      "mix: %zu tensors of %s to %s (log-uniform, seed %llu), %s in all, "
      "reads of at most %s, %d streams, best of %d\n",
      sizes.size(), cli::FormatBytes(kMixMinBytes).c_str(),
      cli::FormatBytes(kMixMaxBytes).c_str(),
      static_cast<unsigned long long>(kMixSeed),
      cli::FormatBytes(total).c_str(), cli::FormatBytes(chunk).c_str(), streams,
      reps);

  std::vector<std::unique_ptr<cuda::DeviceBuffer>> dst;
  std::vector<uint8_t*> dests;
  for (uint64_t n : sizes) {
    TH_ASSIGN_OR_RETURN(auto d, cuda::DeviceBuffer::Allocate(0, n));
    dests.push_back(d->data());
    dst.push_back(std::move(d));
  }
  // The limit, before the holders start (they fill and hash their tensors
  // on this GPU).
  double limit = 0;
  {
    std::vector<std::unique_ptr<cuda::DeviceBuffer>> src;
    for (uint64_t n : sizes) {
      TH_ASSIGN_OR_RETURN(auto b, cuda::DeviceBuffer::Allocate(0, n));
      src.push_back(std::move(b));
    }
    TH_ASSIGN_OR_RETURN(
        limit, Best(reps, total, [&] {
          for (size_t i = 0; i < sizes.size(); ++i) {
            TH_RETURN_IF_ERROR(s.CopyAsync(dests[i], src[i]->data(), sizes[i]));
          }
          return s.Synchronize();
        }));
  }
  std::printf("limit  cudaMemcpy D2D, %zu tensors one by one %8.2f GB/s\n",
              sizes.size(), limit);

  TH_ASSIGN_OR_RETURN(
      std::vector<Holder> holders,
      StartHolders(
          {{"--memory", "cuda", "--sizes", list, "--cuda-ipc", "staged"},
           {"--memory", "cuda", "--sizes", list, "--cuda-ipc", "direct"}}));
  const std::vector<ReadOp> reads = TensorReads(sizes, dests, chunk);
  const std::vector<uint8_t> expected = Pattern(leading_bytes, 7);
  const std::vector<uint8_t> zeros(leading_bytes, 0);
  std::vector<uint8_t> back(leading_bytes);
  struct Row {
    const char* name;
    const Holder* from;
    std::optional<ChunkChecksum> verify;
    bool warm;
  } rows[] = {
      {"mix fetch D2D, CUDA IPC, verified", &holders[0], verify, false},
      {"mix fetch D2D, CUDA IPC, not verified", &holders[0], std::nullopt,
       false},
      {"mix fetch D2D, CUDA IPC, verified, warm", &holders[0], verify, true},
      {"mix fetch D2D, CUDA IPC direct, verified", &holders[1], verify, false},
      {"mix fetch D2D, CUDA IPC direct, not verified", &holders[1],
       std::nullopt, false},
      {"mix fetch D2D, CUDA IPC direct, verif., warm", &holders[1], verify,
       true},
  };
  for (const Row& r : rows) {
    uint64_t at = 0;
    for (size_t i = 0; i < leading; at += sizes[i], ++i) {
      TH_RETURN_IF_ERROR(s.CopyAsync(dests[i], zeros.data() + at, sizes[i]));
    }
    TH_RETURN_IF_ERROR(s.Synchronize());
    TH_ASSIGN_OR_RETURN(
        double gbs, MeasureReads(t, *r.from, reads, total, streams, reps, true,
                                 r.verify, r.warm));
    at = 0;
    for (size_t i = 0; i < leading; at += sizes[i], ++i) {
      TH_RETURN_IF_ERROR(s.CopyAsync(back.data() + at, dests[i], sizes[i]));
    }
    TH_RETURN_IF_ERROR(s.Synchronize());
    if (back != expected) {
      const size_t bad =
          std::mismatch(back.begin(), back.end(), expected.begin()).first -
          back.begin();
      return Internal(std::string(r.name) + ": byte " + std::to_string(bad) +
                      " of the mix's first " + std::to_string(leading) +
                      " tensors differs from the holder's");
    }
    PrintRow(r.name, gbs, {{limit, "D2D 300 tensors"}});
  }
  Quit(holders);
  return Status::Ok();
}

int Run(int argc, char** argv) {
  uint64_t bytes = 0, chunk = 0;
  int streams = 4, reps = 3;
  bool no_mix = false;
  CLI::App app(
      "device memory on the data plane, beside cudaMemcpy and a raw TCP "
      "socket: 1 GiB reads, then a model-like mix of 300 tensors",
      "gpu_bench");
  cli::AddBytesOption(&app, "--bytes", &bytes, "1GiB",
                      "bytes of the holder's tensor, read whole each rep (and "
                      "moved by the raw TCP limit)");
  cli::AddBytesOption(&app, "--chunk", &chunk, "64MiB",
                      "the chunk size (the largest read; the mix reads each "
                      "tensor in pieces of at most this)");
  app.add_option("--streams", streams,
                 "parallel streams (connections; the raw TCP limit uses as "
                 "many)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--reps", reps, "runs (the best is reported)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_flag("--no-mix", no_mix,
               "skip the model-like mix (300 tensors of 4 KiB to 200 MiB, "
               "log-uniform, seeded, fetched by CUDA IPC after the 1 GiB "
               "rows)");
  if (std::optional<int> rc = cli::ParseFlags(app, argc, argv)) return *rc;
  if (chunk == 0) return cli::Fail(InvalidArgument("--chunk must be > 0"));
  if (bytes == 0) return cli::Fail(InvalidArgument("--bytes must be > 0"));
  std::string why;
  if (cuda::DeviceCount(&why) == 0) {
    std::printf("gpu_bench: skipped, no CUDA device: %s\n", why.c_str());
    return 0;
  }
  auto src = cuda::DeviceBuffer::Allocate(0, bytes);
  auto dst = cuda::DeviceBuffer::Allocate(0, bytes + 1001);
  auto stream = cuda::Stream::Create(0);
  if (!src.ok() || !dst.ok() || !stream.ok())
    return cli::Fail(Internal("allocation failed"));
  cuda::Stream& s = **stream;
  std::printf("gpu_bench: %s, chunk %s, %d streams, best of %d\n",
              cli::FormatBytes(bytes).c_str(), cli::FormatBytes(chunk).c_str(),
              streams, reps);

  // Limits.
  auto d2d = Best(reps, bytes, [&] {
    TH_RETURN_IF_ERROR(s.CopyAsync((*dst)->data(), (*src)->data(), bytes));
    return s.Synchronize();
  });
  auto pinned = cuda::StagingPool().Acquire(1, Deadline::AfterMs(5000));
  if (!d2d.ok() || !pinned.ok()) return cli::Fail(Internal("baseline failed"));
  const uint64_t pb = cuda::StagingPool().buffer_bytes();
  auto d2h = Best(reps, bytes, [&] {
    for (uint64_t off = 0; off < bytes; off += pb) {
      TH_RETURN_IF_ERROR(s.CopyAsync(pinned->buffer(0), (*src)->data() + off,
                                     std::min(pb, bytes - off)));
    }
    return s.Synchronize();
  });
  auto h2d = Best(reps, bytes, [&] {
    for (uint64_t off = 0; off < bytes; off += pb) {
      TH_RETURN_IF_ERROR(s.CopyAsync((*dst)->data() + off, pinned->buffer(0),
                                     std::min(pb, bytes - off)));
    }
    return s.Synchronize();
  });
  pinned = cuda::PinnedPool::Lease();
  if (!d2h.ok() || !h2d.ok()) return cli::Fail(Internal("baseline failed"));
  std::vector<uint8_t> host(bytes);
  auto raw = RawTcpLimit(reps, host.data(), bytes, streams);
  if (!raw.ok()) return cli::Fail(raw.status());
  auto hash = [&](ChunkChecksum kind) {
    return Best(reps, bytes, [&] {
      iovec v{(*src)->data(), bytes};
      return s.Checksum(kind, {&v, 1}).status();
    });
  };
  uint64_t chunks = (bytes + chunk - 1) / chunk;
  auto hash_chunks = [&](ChunkChecksum kind) {
    return Best(reps, bytes, [&] {
      for (uint64_t c = 0; c < chunks; ++c) {
        iovec v{(*src)->data() + c * chunk, std::min(chunk, bytes - c * chunk)};
        TH_RETURN_IF_ERROR(s.Checksum(kind, {&v, 1}).status());
      }
      return Status::Ok();
    });
  };
  std::printf("limit  cudaMemcpy D2D            %8.2f GB/s\n", *d2d);
  std::printf("limit  cudaMemcpy D2H to pinned  %8.2f GB/s (4 MiB copies)\n",
              *d2h);
  std::printf("limit  cudaMemcpy H2D from pinned%8.2f GB/s (4 MiB copies)\n",
              *h2d);
  std::printf("limit  raw TCP socket, %d streams  %8.2f GB/s (loopback)\n",
              streams, *raw);
  for (ChunkChecksum kind : {ChunkChecksum::kXxh3, ChunkChecksum::kXxh3Tree}) {
    const std::string name = ChunkChecksumName(kind);
    std::printf("device %s, one %s input      %8.2f GB/s\n", name.c_str(),
                cli::FormatBytes(bytes).c_str(), OrElse(hash(kind), 0.0));
    std::printf("device %s, %s chunks, serial %8.2f GB/s\n", name.c_str(),
                cli::FormatBytes(chunk).c_str(),
                OrElse(hash_chunks(kind), 0.0));
  }

  // The holder processes: one with the default CUDA IPC policy (readers get
  // copies in its staging buffers), one that shares its allocation itself
  // (--cuda-ipc direct, trusted hosts; docs/security.md).
  const std::string bytes_arg = std::to_string(bytes);
  auto holders = StartHolders({{"--memory", "cuda", "--bytes", bytes_arg,
                                "--tensors", "1", "--cuda-ipc", "staged"},
                               {"--memory", "cuda", "--bytes", bytes_arg,
                                "--tensors", "1", "--cuda-ipc", "direct"}});
  if (!holders.ok()) return cli::Fail(holders.status());
  const Holder& holder = (*holders)[0];
  const Holder& direct = (*holders)[1];

  auto ipc_t = transport::MakeTcpTransport();
  transport::TcpTransportOptions off;
  off.local_reads = false;
  auto staged_t = transport::MakeTcpTransport(off);
  // Verified reads check the manifest's default chunk checksum (the
  // XXH3-64 tree); the first row, plain XXH3-64 (earlier manifests).
  const std::optional<ChunkChecksum> tree = kDefaultChunkChecksum;
  const Limit d2d_limit{*d2d, "D2D"};
  const Limit d2h_limit{*d2h, "D2H pinned"};
  const Limit raw_limit{*raw, "raw TCP"};
  struct Case {
    const char* name;
    transport::Transport* t;
    bool device;
    std::optional<ChunkChecksum> verify;
    const Holder* from;
    bool warm;
    bool over_tcp;  // beside D2H pinned and the raw socket, not D2D
  } cases[] = {
      {"fetch D2D, CUDA IPC, verified, xxh3-64", ipc_t.get(), true,
       ChunkChecksum::kXxh3, &holder, false, false},
      {"fetch D2D, CUDA IPC, verified on device", ipc_t.get(), true, tree,
       &holder, false, false},
      {"fetch D2D, CUDA IPC, not verified", ipc_t.get(), true, std::nullopt,
       &holder, false, false},
      {"fetch D2D, CUDA IPC, verified, warm", ipc_t.get(), true, tree, &holder,
       true, false},
      {"fetch D2D, CUDA IPC direct, verified", ipc_t.get(), true, tree, &direct,
       false, false},
      {"fetch D2D, CUDA IPC direct, not verif.", ipc_t.get(), true,
       std::nullopt, &direct, false, false},
      {"fetch D2D, CUDA IPC direct, verified, warm", ipc_t.get(), true, tree,
       &direct, true, false},
      {"fetch D2H, staged by holder, verified", staged_t.get(), false, tree,
       &holder, false, true},
      {"fetch D2D, staged both ends, verified", staged_t.get(), true, tree,
       &holder, false, true},
  };
  for (const Case& c : cases) {
    uint8_t* dest = c.device ? (*dst)->data() : host.data();
    const std::vector<ReadOp> reads = ChunkReads(dest, bytes, chunk);
    auto gbs = MeasureReads(*c.t, *c.from, reads, bytes, streams, reps,
                            c.device, c.verify, c.warm);
    if (!gbs.ok()) return cli::Fail(gbs.status());
    if (c.over_tcp) {
      PrintRow(c.name, *gbs, {d2h_limit, raw_limit});
    } else {
      PrintRow(c.name, *gbs, {d2d_limit});
    }
  }
  Status overhead =
      PerReadOverhead(*ipc_t, holder, direct, (*dst)->data(), (*src)->data(),
                      std::min<uint64_t>(4 << 10, bytes), s, tree);
  if (!overhead.ok()) return cli::Fail(overhead);
  Quit(*holders);
  if (!no_mix) {
    Status m = RunMix(reps, chunk, streams, *ipc_t, s, tree);
    if (!m.ok()) return cli::Fail(m);
  }
  return 0;
}

}  // namespace
}  // namespace tensorhub::testing

int main(int argc, char** argv) {
  int rc = tensorhub::testing::MaybeRunGpuRole(argc, argv);
  if (rc >= 0) return rc;
  return tensorhub::testing::Run(argc, argv);
}
