// Device memory on the data plane, beside the limits measured in the same
// run: same-host device-to-device reads (CUDA IPC, verified by the device
// checksum) beside cudaMemcpy device to device, and reads staged through
// pinned host memory beside cudaMemcpy between the device and pinned
// memory. The holder is another process (tests/gpu_roles.h "serve").
//
//   gpu_bench [--bytes 1GiB] [--chunk 64MiB] [--streams 4] [--reps 3]
#include <cstdio>
#include <optional>
#include <thread>

#include "cli_util.h"
#include "common/deadline.h"
#include "cuda/device.h"
#include "gpu_roles.h"
#include "subprocess.h"
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

// Reads [0, bytes) of the holder's part in `chunk` pieces over `streams`
// connections in parallel.
Status ParallelRead(transport::Transport& t, const std::string& addr,
                    uint64_t epoch, uint8_t* dest, uint64_t bytes,
                    uint64_t chunk, int streams, bool device,
                    std::optional<ChunkChecksum> verify) {
  std::atomic<uint64_t> next{0};
  std::vector<Status> errors(streams);
  std::vector<std::thread> threads;
  for (int i = 0; i < streams; ++i) {
    threads.emplace_back([&, i] {
      auto conn = t.Connect(addr, Deadline::AfterMs(5000));
      if (!conn.ok()) {
        errors[i] = conn.status();
        return;
      }
      while (true) {
        uint64_t off = next.fetch_add(chunk);
        if (off >= bytes) return;
        wire::ReadRequest req;
        req.model = "m";
        req.version = 1;
        req.epoch = epoch;
        req.offset = off;
        req.length = std::min(chunk, bytes - off);
        iovec v{dest + off, req.length};
        transport::ReadChecksum sum{.kind = verify.value_or(ChunkChecksum{})};
        transport::ReadChecksum* want = verify ? &sum : nullptr;
        Status s = device ? (*conn)->ReadDevice(req, {&v, 1}, 0,
                                                Deadline::AfterMs(60000), want)
                          : (*conn)->Read(req, {&v, 1},
                                          Deadline::AfterMs(60000), want);
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

int Run(int argc, char** argv) {
  uint64_t bytes = 0, chunk = 0;
  int streams = 4, reps = 3;
  CLI::App app("device memory on the data plane, beside cudaMemcpy",
               "gpu_bench");
  cli::AddBytesOption(&app, "--bytes", &bytes, "1GiB", "bytes per read");
  cli::AddBytesOption(&app, "--chunk", &chunk, "64MiB", "the chunk size");
  app.add_option("--streams", streams, "parallel streams")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--reps", reps, "runs (the best is reported)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  if (std::optional<int> rc = cli::ParseFlags(app, argc, argv)) return *rc;
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
  struct Holder {
    cli::Subprocess proc;
    std::string addr;
    uint64_t epoch = 0;
  };
  auto start = [&](const char* policy) -> Result<Holder> {
    TH_ASSIGN_OR_RETURN(
        cli::Subprocess p,
        cli::Subprocess::Spawn(
            {"--role=serve", "--memory", "cuda", "--bytes",
             std::to_string(bytes), "--tensors", "1", "--cuda-ipc", policy},
            {"TENSORHUB_LOG=warn"}));
    auto ready = p.ReadLine(Deadline::AfterMs(120000));
    if (!ready.ok() || ready->rfind("ready ", 0) != 0)
      return Internal("holder did not start");
    std::string rest = ready->substr(6);
    return Holder{std::move(p), rest.substr(0, rest.find(' ')),
                  std::stoull(rest.substr(rest.find(' ') + 1))};
  };
  auto holder = start("staged");
  if (!holder.ok()) return cli::Fail(holder.status());
  auto direct = start("direct");
  if (!direct.ok()) return cli::Fail(direct.status());

  auto ipc_t = transport::MakeTcpTransport();
  transport::TcpTransportOptions off;
  off.local_reads = false;
  auto staged_t = transport::MakeTcpTransport(off);
  std::vector<uint8_t> host(bytes);
  // Verified reads check the manifest's default chunk checksum (the
  // XXH3-64 tree); the first row, plain XXH3-64 (earlier manifests).
  const std::optional<ChunkChecksum> tree = kDefaultChunkChecksum;
  struct Case {
    const char* name;
    transport::Transport* t;
    bool device;
    std::optional<ChunkChecksum> verify;
    double limit;
    const char* limit_name;
    const Holder* from = nullptr;
  } cases[] = {
      {"fetch D2D, CUDA IPC, verified, xxh3-64", ipc_t.get(), true,
       ChunkChecksum::kXxh3, *d2d, "D2D"},
      {"fetch D2D, CUDA IPC, verified on device", ipc_t.get(), true, tree, *d2d,
       "D2D"},
      {"fetch D2D, CUDA IPC, not verified     ", ipc_t.get(), true,
       std::nullopt, *d2d, "D2D"},
      {"fetch D2D, CUDA IPC direct, verified  ", ipc_t.get(), true, tree, *d2d,
       "D2D", &*direct},
      {"fetch D2D, CUDA IPC direct, not verif.", ipc_t.get(), true,
       std::nullopt, *d2d, "D2D", &*direct},
      {"fetch D2H, staged by holder, verified ", staged_t.get(), false, tree,
       *d2h, "D2H pinned"},
      {"fetch D2D, staged both ends, verified ", staged_t.get(), true, tree,
       *d2h, "D2H pinned"},
  };
  for (const Case& c : cases) {
    uint8_t* dest = c.device ? (*dst)->data() : host.data();
    const Holder& from = c.from != nullptr ? *c.from : *holder;
    auto gbs = Best(reps, bytes, [&] {
      return Check(ParallelRead(*c.t, from.addr, from.epoch, dest, bytes, chunk,
                                streams, c.device, c.verify));
    });
    if (!gbs.ok()) return cli::Fail(gbs.status());
    std::printf("%s %8.2f GB/s  = %.3fx %s\n", c.name, *gbs, *gbs / c.limit,
                c.limit_name);
  }
  (void)holder->proc.Send("quit");
  (void)direct->proc.Send("quit");
  return 0;
}

}  // namespace
}  // namespace tensorhub::testing

int main(int argc, char** argv) {
  int rc = tensorhub::testing::MaybeRunGpuRole(argc, argv);
  if (rc >= 0) return rc;
  return tensorhub::testing::Run(argc, argv);
}
