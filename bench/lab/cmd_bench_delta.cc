// `tensorhub-lab bench delta`: how small the delta of one RL step is, and
// how fast it is made and applied, beside zstd of the whole version and
// memcpy measured in the same run (docs/benchmarks.md section 17).
//
// The versions come from the workload generator (weight_steps.h): fp32
// master weights after --warmup-steps Adam steps at the learning rate, cast
// to bf16 and to FP8 E4M3 (one scale per 128 x 128 elements), then one more
// step; the changed fraction printed is what that arithmetic produced.
// Each pair is cut into chunks of --chunk-bytes and coded chunk by chunk
// (as deltas are served), by every candidate:
//   zstd(v)           the version itself, zstd -1 and -3: what a delta must
//                     beat by far to be worth a base
//   xor+zstd          zstd -1 of v XOR base
//   planes+zstd       the XOR's bytes grouped by their place in the element
//                     (byte planes), zstd -1
//   bitmap+planes     a bitmap of changed elements, then the changed
//                     elements' XOR in byte planes, zstd -1
//   gaps+xor          LEB128 gaps between changed elements, then their XOR
//                     in byte planes, zstd -1
//   gaps+diff (chosen, src/delta/delta_codec.h)  gaps as above, then each
//                     changed element's difference from the base, zigzag
//                     LEB128, zstd -1; with its 32-byte header per chunk
// and then the chosen codec's encode and apply throughput on one thread
// (best of --repeat, in the thread's CPU time: on a shared machine that is
// what one core does, whoever else runs), with xor+zstd's beside it, and
// memcpy of the same bytes timed the same way.
#include <zstd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <sstream>
#include <string>
#include <vector>

#include "cli_util.h"
#include "delta/delta_codec.h"
#include "tensorhub/check.h"
#include "weight_steps.h"

namespace tensorhub::cli {
namespace {

using Bytes = std::vector<uint8_t>;

struct Flags {
  uint64_t elements = 4ull << 20;
  std::string lrs = "1e-6,3e-6,1e-5";
  int warmup_steps = 10;
  uint64_t chunk_bytes = 4ull << 20;
  int repeat = 3;
  uint64_t seed = 1;
};

volatile uint64_t g_sink;

class Zstd {
 public:
  Zstd() : c_(ZSTD_createCCtx()), d_(ZSTD_createDCtx()) {}
  ~Zstd() {
    ZSTD_freeCCtx(c_);
    ZSTD_freeDCtx(d_);
  }
  size_t Compress(const uint8_t* p, size_t n, int level, Bytes* out) {
    out->resize(ZSTD_compressBound(n));
    const size_t z =
        ZSTD_compressCCtx(c_, out->data(), out->size(), p, n, level);
    TH_CHECK(!ZSTD_isError(z));
    out->resize(z);
    return z;
  }
  void Decompress(const Bytes& in, uint8_t* out, size_t n) {
    const size_t r = ZSTD_decompressDCtx(d_, out, n, in.data(), in.size());
    TH_CHECK(!ZSTD_isError(r) && r == n);
  }

 private:
  ZSTD_CCtx* c_;
  ZSTD_DCtx* d_;
};

void Planes(const uint8_t* x, size_t n, size_t w, uint8_t* out) {
  const size_t e = n / w;
  for (size_t k = 0; k < w; ++k) {
    for (size_t i = 0; i < e; ++i) out[k * e + i] = x[i * w + k];
  }
  std::memcpy(out + e * w, x + e * w, n - e * w);
}

void PutVarint(Bytes* b, uint64_t v) {
  while (v >= 0x80) {
    b->push_back(static_cast<uint8_t>(v | 0x80));
    v >>= 7;
  }
  b->push_back(static_cast<uint8_t>(v));
}

// Bytes of every candidate for one chunk pair, added to `sizes` in the
// order of kCandidates.
constexpr const char* kCandidates[] = {
    "zstd -1 of v (no base)",
    "zstd -3 of v (no base)",
    "xor+zstd",
    "planes+zstd",
    "bitmap+planes",
    "gaps+xor",
};
constexpr size_t kNumCandidates = std::size(kCandidates);

void Candidates(Zstd& z, const uint8_t* b, const uint8_t* v, size_t n, size_t w,
                uint64_t* sizes) {
  Bytes out, x(n), planes(n);
  sizes[0] += z.Compress(v, n, 1, &out);
  sizes[1] += z.Compress(v, n, 3, &out);
  for (size_t i = 0; i < n; ++i) x[i] = b[i] ^ v[i];
  sizes[2] += z.Compress(x.data(), n, 1, &out);
  Planes(x.data(), n, w, planes.data());
  sizes[3] += z.Compress(planes.data(), n, 1, &out);
  const size_t elems = n / w;
  Bytes bitmap((elems + 7) / 8, 0), vals, gaps;
  uint64_t next = 0;
  for (size_t e = 0; e < elems; ++e) {
    bool changed = false;
    for (size_t k = 0; k < w; ++k) changed |= x[e * w + k] != 0;
    if (!changed) continue;
    bitmap[e / 8] |= static_cast<uint8_t>(1u << (e % 8));
    vals.insert(vals.end(), x.begin() + e * w, x.begin() + (e + 1) * w);
    PutVarint(&gaps, e - next);
    next = e + 1;
  }
  Bytes vplanes(vals.size());
  Planes(vals.data(), vals.size(), w, vplanes.data());
  Bytes all = bitmap;
  all.insert(all.end(), vplanes.begin(), vplanes.end());
  sizes[4] += z.Compress(all.data(), all.size(), 1, &out);
  all = gaps;
  all.insert(all.end(), vplanes.begin(), vplanes.end());
  sizes[5] += z.Compress(all.data(), all.size(), 1, &out);
}

// This thread's CPU time: the machine is shared, and "per core" means the
// time the core spent on it, not the time other processes had it.
double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) +
         1e-9 * static_cast<double>(ts.tv_nsec);
}

// Best CPU seconds of `repeat` runs of fn.
template <typename Fn>
double Best(int repeat, Fn&& fn) {
  double best = 1e30;
  for (int r = 0; r < repeat; ++r) {
    const double t0 = ThreadCpuSeconds();
    fn();
    best = std::min(best, ThreadCpuSeconds() - t0);
  }
  return best;
}

struct PairResult {
  double changed = 0;
  uint64_t bytes = 0;
  uint64_t sizes[kNumCandidates] = {};
  uint64_t chosen = 0;        // the library's deltas, headers included
  uint64_t whole_chunks = 0;  // chunks it would not make a delta of
  double encode_gbs = 0, apply_gbs = 0, xor_encode_gbs = 0, xor_apply_gbs = 0,
         memcpy_gbs = 0;
};

PairResult Measure(const Flags& f, const Bytes& base, const Bytes& version,
                   uint32_t w) {
  PairResult r;
  const size_t n = version.size();
  r.bytes = n;
  r.changed = lab::ChangedFraction(base.data(), version.data(), n, w);
  Zstd z;
  delta::Codec codec;
  std::vector<std::string> deltas;
  for (size_t at = 0; at < n; at += f.chunk_bytes) {
    const size_t len = std::min<size_t>(f.chunk_bytes, n - at);
    Candidates(z, base.data() + at, version.data() + at, len, w, r.sizes);
    const iovec b{const_cast<uint8_t*>(base.data()) + at, len};
    const iovec v{const_cast<uint8_t*>(version.data()) + at, len};
    std::string d;
    const Result<bool> made = codec.Encode({&b, 1}, {&v, 1}, w, &d);
    TH_CHECK(made.ok());
    if (*made) {
      r.chosen += d.size();
    } else {
      r.chosen += len;  // it travels whole
      ++r.whole_chunks;
    }
    deltas.push_back(std::move(d));
  }
  // Throughput, one thread, in bytes of the version per second.
  Bytes out(n, 1);
  r.memcpy_gbs = n /
                 Best(f.repeat,
                      [&] {
                        std::memcpy(out.data(), base.data(), n);
                        g_sink = g_sink + out[n / 2];
                      }) /
                 1e9;
  std::string scratch;
  r.encode_gbs =
      n /
      Best(f.repeat,
           [&] {
             for (size_t at = 0; at < n; at += f.chunk_bytes) {
               const size_t len = std::min<size_t>(f.chunk_bytes, n - at);
               const iovec b{const_cast<uint8_t*>(base.data()) + at, len};
               const iovec v{const_cast<uint8_t*>(version.data()) + at, len};
               scratch.clear();
               TH_CHECK(codec.Encode({&b, 1}, {&v, 1}, w, &scratch).ok());
             }
           }) /
      1e9;
  r.apply_gbs =
      n /
      Best(f.repeat,
           [&] {
             size_t c = 0;
             for (size_t at = 0; at < n; at += f.chunk_bytes, ++c) {
               const size_t len = std::min<size_t>(f.chunk_bytes, n - at);
               const iovec b{const_cast<uint8_t*>(base.data()) + at, len};
               const iovec o{out.data() + at, len};
               if (deltas[c].empty()) {
                 std::memcpy(out.data() + at, version.data() + at, len);
                 continue;
               }
               TH_CHECK(codec
                            .Apply({reinterpret_cast<const uint8_t*>(
                                        deltas[c].data()),
                                    deltas[c].size()},
                                   {&b, 1}, {&o, 1})
                            .ok());
             }
           }) /
      1e9;
  TH_CHECK(out == version);  // every delta applied exactly
  // xor+zstd made and applied the same way, for comparison.
  std::vector<Bytes> xz;
  Bytes x(f.chunk_bytes);
  r.xor_encode_gbs = n /
                     Best(f.repeat,
                          [&] {
                            xz.clear();
                            for (size_t at = 0; at < n; at += f.chunk_bytes) {
                              const size_t len =
                                  std::min<size_t>(f.chunk_bytes, n - at);
                              for (size_t i = 0; i < len; ++i) {
                                x[i] = base[at + i] ^ version[at + i];
                              }
                              xz.emplace_back();
                              z.Compress(x.data(), len, 1, &xz.back());
                            }
                          }) /
                     1e9;
  r.xor_apply_gbs =
      n /
      Best(f.repeat,
           [&] {
             size_t c = 0;
             for (size_t at = 0; at < n; at += f.chunk_bytes, ++c) {
               const size_t len = std::min<size_t>(f.chunk_bytes, n - at);
               z.Decompress(xz[c], x.data(), len);
               for (size_t i = 0; i < len; ++i) {
                 out[at + i] = base[at + i] ^ x[i];
               }
             }
           }) /
      1e9;
  TH_CHECK(out == version);
  return r;
}

void Print(const char* dtype, double lr, const PairResult& r) {
  std::printf("\n%s, lr %g: %s per version, %.3f%% of elements changed\n",
              dtype, lr, FormatBytes(r.bytes).c_str(), 100 * r.changed);
  std::printf("  %-34s %10s %9s %13s\n", "encoding", "bytes", "/ S",
              "/ zstd-1(v)");
  const double zstd1 = static_cast<double>(r.sizes[0]);
  for (size_t i = 0; i < kNumCandidates; ++i) {
    std::printf("  %-34s %10s %9.4f %13.4f\n", kCandidates[i],
                FormatBytes(r.sizes[i]).c_str(),
                static_cast<double>(r.sizes[i]) / r.bytes, r.sizes[i] / zstd1);
  }
  std::printf("  %-34s %10s %9.4f %13.4f%s\n", "gaps+diff (chosen, as served)",
              FormatBytes(r.chosen).c_str(),
              static_cast<double>(r.chosen) / r.bytes, r.chosen / zstd1,
              r.whole_chunks ? "  (some chunks whole)" : "");
  std::printf(
      "  one thread (its CPU time), GB/s of the version: memcpy %.2f | "
      "gaps+diff encode "
      "%.2f (%.2fx memcpy) apply %.2f (%.2fx) | xor+zstd encode %.2f "
      "(%.2fx) apply %.2f (%.2fx)\n",
      r.memcpy_gbs, r.encode_gbs, r.encode_gbs / r.memcpy_gbs, r.apply_gbs,
      r.apply_gbs / r.memcpy_gbs, r.xor_encode_gbs,
      r.xor_encode_gbs / r.memcpy_gbs, r.xor_apply_gbs,
      r.xor_apply_gbs / r.memcpy_gbs);
}

Result<std::vector<double>> ParseLrs(const std::string& s) {
  std::vector<double> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0' || !(v >= 0) || v > 1) {
      return InvalidArgument("--lrs: '" + item +
                             "' is not a learning rate in [0, 1]");
    }
    out.push_back(v);
  }
  if (out.empty()) return InvalidArgument("--lrs: give at least one");
  return out;
}

int Run(const Flags& f) {
  auto lrs = ParseLrs(f.lrs);
  if (!lrs.ok()) return UsageError(lrs.status().message());
  std::printf(
      "bench delta: %llu elements, Adam (beta 0.9, 0.999) on fp32 master "
      "weights ~N(0, 0.02), %d warm-up steps then one more, cast to bf16 and "
      "FP8 E4M3 (a scale per 16384 elements); chunks of %s; seed %llu\n",
      static_cast<unsigned long long>(f.elements), f.warmup_steps,
      FormatBytes(f.chunk_bytes).c_str(),
      static_cast<unsigned long long>(f.seed));
  double worst_at_2pct = -1;
  for (double lr : *lrs) {
    lab::WeightStepsOptions o;
    o.elements = f.elements;
    o.seed = f.seed;
    lab::WeightSteps steps(o);
    for (int i = 0; i < f.warmup_steps; ++i) steps.Step(static_cast<float>(lr));
    Bytes bf16_base(steps.Bf16Bytes()), fp8_base(steps.Fp8Bytes());
    steps.CastBf16(bf16_base);
    steps.CastFp8(fp8_base);
    steps.Step(static_cast<float>(lr));
    Bytes bf16(steps.Bf16Bytes()), fp8(steps.Fp8Bytes());
    steps.CastBf16(bf16);
    steps.CastFp8(fp8);
    const PairResult rb = Measure(f, bf16_base, bf16, 2);
    Print("bf16", lr, rb);
    const PairResult rf = Measure(f, fp8_base, fp8, 1);
    Print("fp8-e4m3", lr, rf);
    for (const PairResult* r : {&rb, &rf}) {
      if (r->changed <= 0.02) {
        worst_at_2pct =
            std::max(worst_at_2pct, static_cast<double>(r->chosen) / r->bytes);
      }
    }
  }
  if (worst_at_2pct >= 0) {
    std::printf(
        "\nworst delta at <= 2%% of elements changed: %.4f S (target <= 0.1 "
        "S: %s)\n",
        worst_at_2pct, worst_at_2pct <= 0.1 ? "met" : "NOT met");
  }
  return 0;
}

}  // namespace

void AddBenchDeltaCommand(CommandLine& cl, CLI::App* bench) {
  auto f = std::make_shared<Flags>();
  CLI::App* c = cl.Add(
      "delta",
      "delta size of one RL step (bf16, FP8) by codec candidate, beside zstd "
      "of the version; encode/apply throughput beside memcpy",
      [f] { return Run(*f); }, bench);
  c->add_option("--elements", f->elements, "weights per version")
      ->check(CLI::Range(uint64_t{1} << 10, uint64_t{1} << 30))
      ->capture_default_str();
  c->add_option("--lrs", f->lrs, "learning rates, comma-separated")
      ->capture_default_str();
  c->add_option("--warmup-steps", f->warmup_steps,
                "Adam steps before the measured one")
      ->check(CLI::Range(0, 10000))
      ->capture_default_str();
  AddBytesOption(c, "--chunk-bytes", &f->chunk_bytes, "4MiB",
                 "chunks coded one by one (as served)")
      ->check(CLI::Range(uint64_t{4096}, uint64_t{1} << 30));
  c->add_option("--repeat", f->repeat, "runs per throughput (the best counts)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  c->add_option("--seed", f->seed, "the generator's seed")
      ->capture_default_str();
}

}  // namespace tensorhub::cli
