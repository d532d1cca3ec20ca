// `tensorhub-lab bench reshard`: a Llama-shaped model of about 0.5B
// parameters (hidden 1024, 16 heads / 8 kv heads, MLP 4096, 24 layers,
// vocabulary 50304, untied lm_head; bf16, about 0.95 GB) published by a
// trainer group as FSDP(K) shards, fetched by rollout ranks of TP(M).
//
// In one process on loopback (a hub, K trainer clients, one reader client
// per TP rank, the TCP data plane), each TP rank is measured alone:
//   partial: FetchSlices of the rank's boxes (TpRankBox);
//   full + slice: a full fetch of every logical tensor, then copying the
//     rank's boxes out of it (what a rank does without partial fetch);
// and the bytes the holders served (their own counters) against the bound:
// the rank's share, i.e. the bytes of its boxes (1/TP of the sharded
// tensors plus the replicated ones). Prints both ratios per rank.
// Then holders of slices: a first TP(M) instance serves its ranks' slices
// (FetchOptions::serve_slices) and a second fetches the same boxes; prints
// the trainers' bytes for each instance and the first one's for the second.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <thread>

#include "cli_util.h"
#include "client/counted_client.h"
#include "common/deadline.h"
#include "common/geometry.h"
#include "tensorhub/client.h"
#include "tensorhub/hub.h"
#include "tensorhub/reshard.h"

namespace tensorhub::cli {
namespace {

using Shape = std::vector<uint64_t>;

using Worker = client::CountedClient;

std::vector<std::pair<std::string, Shape>> LlamaHalfB(double scale) {
  const uint64_t h = 1024, inter = 4096, kv = 512;
  const uint64_t vocab = static_cast<uint64_t>(50304 * scale) / 64 * 64 + 64;
  const int layers = std::max(1, static_cast<int>(24 * scale));
  std::vector<std::pair<std::string, Shape>> out = {
      {"model.embed_tokens.weight", {vocab, h}}};
  for (int l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    out.push_back({p + "input_layernorm.weight", {h}});
    out.push_back({p + "self_attn.q_proj.weight", {h, h}});
    out.push_back({p + "self_attn.k_proj.weight", {kv, h}});
    out.push_back({p + "self_attn.v_proj.weight", {kv, h}});
    out.push_back({p + "self_attn.o_proj.weight", {h, h}});
    out.push_back({p + "post_attention_layernorm.weight", {h}});
    out.push_back({p + "mlp.gate_proj.weight", {inter, h}});
    out.push_back({p + "mlp.up_proj.weight", {inter, h}});
    out.push_back({p + "mlp.down_proj.weight", {h, inter}});
  }
  out.push_back({"model.norm.weight", {h}});
  out.push_back({"lm_head.weight", {vocab, h}});
  return out;
}

Result<Worker> NewWorker(const std::string& hub, const std::string& name) {
  ClientOptions o;
  o.hub_address = hub;
  o.name = name;
  return client::ConnectCounted(o);
}

uint64_t Served(const std::vector<Worker>& ws) {
  uint64_t n = 0;
  for (const Worker& w : ws) n += w.served();
  return n;
}

// The holders' counters since `before`, once they have caught up with
// `received` (a holder counts a read when its send returned, which may be
// just after the reader has the bytes); bounded by 10 s.
uint64_t ServedSince(const std::vector<Worker>& ws, uint64_t before,
                     uint64_t received) {
  const Deadline deadline = Deadline::AfterMs(10000);
  uint64_t n = Served(ws) - before;
  while (n < received && !deadline.expired()) {
    std::this_thread::yield();
    n = Served(ws) - before;
  }
  return n;
}

// Of the manifest `st` took from a source, the bytes one of `ws` served:
// holders count a manifest they serve among their served bytes, and it is
// not tensor data.
uint64_t ManifestFrom(const std::vector<Worker>& ws, const FetchStats& st) {
  if (st.manifest_bytes == 0) return 0;
  for (const Worker& w : ws) {
    if (w.client->data_address() == st.manifest_source)
      return st.manifest_bytes;
  }
  return 0;
}

// Tensor bytes `ws` served for `st` since `before`: ServedSince, less the
// manifest if one of them served it.
uint64_t TensorBytesSince(const std::vector<Worker>& ws, uint64_t before,
                          const FetchStats& st) {
  const uint64_t m = ManifestFrom(ws, st);
  const uint64_t n = ServedSince(ws, before, st.bytes + m);
  return n - std::min(n, m);
}

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
      .count();
}

// TP rank `rank` of `tp`'s boxes of every tensor, into buffers in `out`;
// returns their bytes.
Result<uint64_t> RankSlices(
    const std::vector<std::pair<std::string, Shape>>& model, uint32_t rank,
    uint32_t tp, const ModelDims& dims, std::deque<std::vector<uint8_t>>& out,
    std::vector<TensorSlice>& slices) {
  uint64_t bytes = 0;
  for (const auto& [name, shape] : model) {
    TH_ASSIGN_OR_RETURN(Box box, TpRankBox(name, shape, rank, tp, dims));
    if (box.Elements() == 0) continue;
    std::vector<uint8_t>& o = out.emplace_back(box.Elements() * 2);
    slices.push_back({{{name, DType::kBF16, box.extent},
                       o.data(),
                       o.size(),
                       MemoryLocation::Host()},
                      box,
                      {}});
    bytes += o.size();
  }
  return bytes;
}

// Holders of slices: a first TP(tp) instance fetches its ranks' slices and
// serves them (FetchOptions::serve_slices), then a second instance's ranks
// fetch the same boxes. Per rank: the trainers' bytes for each instance and
// the first instance's bytes for the second (the holders' own counters).
int RunSliceHolders(const std::string& hub,
                    const std::vector<std::pair<std::string, Shape>>& model,
                    const std::vector<Worker>& trainers, uint32_t tp,
                    const ModelDims& dims) {
  std::printf(
      "\nholders of slices: a second TP(%u) instance after a first that "
      "serves its slices\n",
      tp);
  std::printf("%-5s %12s %12s %12s %12s %9s %9s\n", "rank", "bound",
              "trainers A", "trainers B", "holders B", "tB/tA", "t_B s");
  std::vector<Worker> first;
  std::deque<std::deque<std::vector<uint8_t>>> held;  // served: never moves
  std::vector<uint64_t> from_trainers_a;
  for (uint32_t rank = 0; rank < tp; ++rank) {
    Result<Worker> w = NewWorker(hub, "A" + std::to_string(rank));
    if (!w.ok()) return Fail(w.status());
    first.push_back(std::move(*w));
    std::vector<TensorSlice> slices;
    Result<uint64_t> bound =
        RankSlices(model, rank, tp, dims, held.emplace_back(), slices);
    if (!bound.ok()) return Fail(bound.status());
    FetchOptions fo;
    fo.serve_slices = true;
    const uint64_t before = Served(trainers);
    Result<FetchStats> st =
        first.back().client->FetchSlices("m", Version(1), slices, fo);
    if (!st.ok()) return Fail(st.status());
    from_trainers_a.push_back(TensorBytesSince(trainers, before, *st));
  }
  for (uint32_t rank = 0; rank < tp; ++rank) {
    Result<Worker> reader = NewWorker(hub, "B" + std::to_string(rank));
    if (!reader.ok()) return Fail(reader.status());
    std::deque<std::vector<uint8_t>> out;
    std::vector<TensorSlice> slices;
    Result<uint64_t> bound = RankSlices(model, rank, tp, dims, out, slices);
    if (!bound.ok()) return Fail(bound.status());
    const uint64_t before_t = Served(trainers), before_h = Served(first);
    const auto t0 = std::chrono::steady_clock::now();
    Result<FetchStats> st =
        reader->client->FetchSlices("m", Version(1), slices);
    const double t_b = Since(t0);
    if (!st.ok()) return Fail(st.status());
    // Both kinds of holder together catch up with what the reader got.
    const uint64_t m_t = ManifestFrom(trainers, *st);
    const uint64_t m_h = ManifestFrom(first, *st);
    const uint64_t expect = st->bytes + m_t + m_h;
    const Deadline deadline = Deadline::AfterMs(10000);
    uint64_t t_bytes = 0, h_bytes = 0;
    do {
      t_bytes = Served(trainers) - before_t;
      h_bytes = Served(first) - before_h;
      if (t_bytes + h_bytes < expect) std::this_thread::yield();
    } while (t_bytes + h_bytes < expect && !deadline.expired());
    t_bytes -= std::min(t_bytes, m_t);
    h_bytes -= std::min(h_bytes, m_h);
    std::printf("%-5u %12s %12s %12s %12s %9.3f %9.2f\n", rank,
                FormatBytes(*bound).c_str(),
                FormatBytes(from_trainers_a[rank]).c_str(),
                FormatBytes(t_bytes).c_str(), FormatBytes(h_bytes).c_str(),
                static_cast<double>(t_bytes) / from_trainers_a[rank], t_b);
  }
  std::printf(
      "trainers A/B: bytes the trainers served to each instance's rank; "
      "holders B: bytes the first instance's ranks served to the second's; "
      "tB/tA: the trainers' bytes for B over those for A\n");
  return 0;
}

// Long on purpose (about 95 lines): one run's setup, the two ways of
// fetching and the report read best as one sequence.
int Run(uint32_t k, uint32_t tp, double scale) {
  const ModelDims dims{16, 8, 64, 0};
  const auto model = LlamaHalfB(scale);
  HubOptions ho;
  ho.listen_address = "127.0.0.1:0";
  ho.rebuild_ms = 0;
  Result<std::unique_ptr<Hub>> hub = Hub::Start(ho);
  if (!hub.ok()) return Fail(hub.status());
  std::vector<Worker> trainers;
  std::deque<std::vector<uint8_t>> pieces;
  uint64_t total = 0;
  for (uint32_t r = 0; r < k; ++r) {
    Result<Worker> w =
        NewWorker((*hub)->address(), "trainer" + std::to_string(r));
    if (!w.ok()) return Fail(w.status());
    trainers.push_back(std::move(*w));
    std::vector<TensorRef> refs;
    PublishOptions po;
    po.rank = r;
    po.group_size = k;
    for (const auto& [name, shape] : model) {
      const Box box = FsdpShards(shape, k)[r];
      if (box.Elements() == 0) continue;
      std::vector<uint8_t>& bytes = pieces.emplace_back(box.Elements() * 2);
      for (size_t i = 0; i < bytes.size(); ++i)
        bytes[i] = static_cast<uint8_t>(i * 7 + r);
      refs.push_back({{name, DType::kBF16, box.extent},
                      bytes.data(),
                      bytes.size(),
                      MemoryLocation::Host()});
      po.pieces[name] = {shape, box.offset};
      total += bytes.size();
    }
    Status s = trainers.back().client->Publish("m", Version(1), refs, po);
    if (!s.ok()) return Fail(s);
  }
  std::printf(
      "model: %zu tensors, %s (bf16), trainer FSDP(%u), rollout TP(%u)\n",
      model.size(), FormatBytes(total).c_str(), k, tp);
  std::printf("%-5s %12s %12s %12s %9s %9s %9s %9s\n", "rank", "bound",
              "partial", "full", "part/bnd", "full/bnd", "t_part s",
              "t_full s");
  for (uint32_t rank = 0; rank < tp; ++rank) {
    Result<Worker> reader =
        NewWorker((*hub)->address(), "rank" + std::to_string(rank));
    if (!reader.ok()) return Fail(reader.status());
    std::vector<TensorSlice> slices;
    std::deque<std::vector<uint8_t>> out;
    uint64_t bound = 0;
    for (const auto& [name, shape] : model) {
      Result<Box> box = TpRankBox(name, shape, rank, tp, dims);
      if (!box.ok()) return Fail(box.status());
      if (box->Elements() == 0) continue;
      std::vector<uint8_t>& o = out.emplace_back(box->Elements() * 2);
      slices.push_back({{{name, DType::kBF16, box->extent},
                         o.data(),
                         o.size(),
                         MemoryLocation::Host()},
                        *box,
                        {}});
      bound += o.size();
    }
    uint64_t before = Served(trainers);
    auto t0 = std::chrono::steady_clock::now();
    Result<FetchStats> st =
        reader->client->FetchSlices("m", Version(1), slices);
    const double t_part = Since(t0);
    if (!st.ok()) return Fail(st.status());
    const uint64_t partial = TensorBytesSince(trainers, before, *st);
    // Full fetch, then slice out the same boxes.
    std::vector<std::vector<uint8_t>> whole;
    std::vector<TensorRef> dest;
    whole.reserve(model.size());
    for (const auto& [name, shape] : model) {
      whole.emplace_back(Box::Whole(shape).Elements() * 2);
      dest.push_back({{name, DType::kBF16, shape},
                      whole.back().data(),
                      whole.back().size(),
                      MemoryLocation::Host()});
    }
    before = Served(trainers);
    t0 = std::chrono::steady_clock::now();
    Result<FetchStats> full = reader->client->Fetch("m", Version(1), dest);
    if (!full.ok()) return Fail(full.status());
    size_t ti = 0;
    for (const TensorSlice& s : slices) {
      while (model[ti].first != s.tensor.spec.name) ++ti;
      const Box whole_box = Box::Whole(model[ti].second);
      for (const StridedRun& r : PlanCopy(s.box, whole_box, s.box, 2)) {
        for (uint64_t i = 0; i < r.count; ++i) {
          std::memcpy(static_cast<uint8_t*>(s.tensor.data) + r.dst_offset +
                          i * r.dst_stride,
                      whole[ti].data() + r.src_offset + i * r.src_stride,
                      r.run_bytes);
        }
      }
    }
    const double t_full = Since(t0);
    const uint64_t full_bytes = TensorBytesSince(trainers, before, *full);
    std::printf("%-5u %12s %12s %12s %9.3f %9.3f %9.2f %9.2f\n", rank,
                FormatBytes(bound).c_str(), FormatBytes(partial).c_str(),
                FormatBytes(full_bytes).c_str(),
                static_cast<double>(partial) / bound,
                static_cast<double>(full_bytes) / bound, t_part, t_full);
  }
  std::printf(
      "bound: the bytes of the rank's boxes (1/%u of the split tensors plus "
      "the "
      "replicated ones); partial and full: bytes the trainers served (their "
      "counters); times on loopback, one rank at a time\n",
      tp);
  return RunSliceHolders((*hub)->address(), model, trainers, tp, dims);
}

}  // namespace

void AddBenchReshardCommand(CommandLine& cl, CLI::App* bench) {
  struct Flags {
    uint32_t trainers = 4;
    uint32_t tp = 4;
    double scale = 1.0;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* c = cl.Add(
      "reshard",
      "a 0.5B Llama-shaped model, trainer FSDP(K) to rollout "
      "TP(M): partial fetch vs full fetch + slicing",
      [f] { return Run(f->trainers, f->tp, f->scale); }, bench);
  c->add_option("--trainers", f->trainers, "trainer ranks K (FSDP shards)")
      ->check(CLI::Range(1u, 64u))
      ->capture_default_str();
  c->add_option("--tp", f->tp, "rollout tensor-parallel degree M")
      ->check(CLI::Range(1u, 64u))
      ->capture_default_str();
  c->add_option("--scale", f->scale,
                "model size as a fraction of the 0.5B layout")
      ->check(CLI::Range(1e-6, 1.0))
      ->capture_default_str();
}

}  // namespace tensorhub::cli
