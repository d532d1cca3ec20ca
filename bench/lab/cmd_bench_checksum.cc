// `tensorhub-lab bench checksum`: the chunk checksums on the CPU, one
// thread, beside memcpy of the same bytes in the same run. Each kind of
// common/checksum.h over the input cut into chunks, computed two ways: in
// one call per chunk (what a publisher does), and streamed in runs of
// --run-bytes (what a reader's transport does as the bytes arrive). Prints
// each figure, its ratio to memcpy, and the tree's to plain XXH3-64.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "cli_util.h"
#include "common/checksum.h"

namespace tensorhub::cli {
namespace {

volatile uint64_t g_sink;  // the hashes, so that none is optimised away

struct Flags {
  uint64_t bytes = 1ull << 30;
  uint64_t chunk_bytes = 4ull << 20;
  uint64_t run_bytes = 256ull << 10;
  int repeat = 5;
};

// Best GB/s of `repeat` runs of fn over `bytes`; `sink` keeps the hashes
// from being optimised away.
template <typename Fn>
double Best(const Flags& f, uint64_t* sink, Fn&& fn) {
  double best = 0;
  for (int r = 0; r < f.repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    *sink ^= fn();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    best = std::max(best, f.bytes / s / 1e9);
  }
  return best;
}

int Run(const Flags& f) {
  std::vector<uint8_t> src(f.bytes), dst(f.bytes);
  std::mt19937_64 rng(20261125);
  for (uint64_t i = 0; i + 8 <= f.bytes; i += 8) {
    const uint64_t v = rng();
    std::memcpy(src.data() + i, &v, 8);
  }
  std::memset(dst.data(), 1, dst.size());  // fault every page in first
  const uint64_t chunks = (f.bytes + f.chunk_bytes - 1) / f.chunk_bytes;
  auto chunk_len = [&](uint64_t c) {
    return std::min(f.chunk_bytes, f.bytes - c * f.chunk_bytes);
  };
  uint64_t sink = 0;
  const double copy = Best(f, &sink, [&] {
    std::memcpy(dst.data(), src.data(), f.bytes);
    return uint64_t{dst[f.bytes / 2]};
  });
  std::printf(
      "bench checksum: %s in chunks of %s, streamed in runs of %s, one "
      "thread, best of %d\n",
      FormatBytes(f.bytes).c_str(), FormatBytes(f.chunk_bytes).c_str(),
      FormatBytes(f.run_bytes).c_str(), f.repeat);
  std::printf("%-44s %8s %10s\n", "", "GB/s", "x memcpy");
  std::printf("%-44s %8.2f %10s\n", "limit: memcpy of the same bytes", copy,
              "1.00");
  double whole[2] = {0, 0}, streamed[2] = {0, 0};
  for (ChunkChecksum kind : {ChunkChecksum::kXxh3, ChunkChecksum::kXxh3Tree}) {
    const int k = kind == ChunkChecksum::kXxh3 ? 0 : 1;
    whole[k] = Best(f, &sink, [&] {
      uint64_t h = 0;
      for (uint64_t c = 0; c < chunks; ++c) {
        h ^= ChunkSum(kind, src.data() + c * f.chunk_bytes, chunk_len(c));
      }
      return h;
    });
    streamed[k] = Best(f, &sink, [&] {
      uint64_t h = 0;
      for (uint64_t c = 0; c < chunks; ++c) {
        ChunkHash s(kind);
        const uint8_t* p = src.data() + c * f.chunk_bytes;
        for (uint64_t at = 0, n = chunk_len(c); at < n; at += f.run_bytes) {
          s.Update(p + at, std::min(f.run_bytes, n - at));
        }
        h ^= s.Digest();
      }
      return h;
    });
    const std::string name = ChunkChecksumName(kind);
    std::printf("%-44s %8.2f %10.2f\n", (name + ", one call per chunk").c_str(),
                whole[k], whole[k] / copy);
    std::printf("%-44s %8.2f %10.2f\n", (name + ", streamed in runs").c_str(),
                streamed[k], streamed[k] / copy);
  }
  std::printf("tree / xxh3-64: %.2f one call per chunk, %.2f streamed\n",
              whole[1] / whole[0], streamed[1] / streamed[0]);
  g_sink = sink;
  return 0;
}

}  // namespace

void AddBenchChecksumCommand(CommandLine& cl, CLI::App* bench) {
  auto f = std::make_shared<Flags>();
  CLI::App* c = cl.Add(
      "checksum",
      "the chunk checksums (xxh3-64, xxh3-64-tree-64k) on one CPU thread, "
      "beside memcpy",
      [f] { return Run(*f); }, bench);
  AddBytesOption(c, "--bytes", &f->bytes, "1GiB", "bytes hashed per run")
      ->check(CLI::Range(uint64_t{1} << 20, uint64_t{1} << 36));
  AddBytesOption(c, "--chunk-bytes", &f->chunk_bytes, "4MiB", "the chunk size")
      ->check(CLI::Range(uint64_t{4096}, uint64_t{1} << 30));
  AddBytesOption(c, "--run-bytes", &f->run_bytes, "256KiB",
                 "the runs a streamed checksum is fed in")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 30));
  c->add_option("--repeat", f->repeat, "runs (the best is reported)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
}

}  // namespace tensorhub::cli
