// Partial fetch end to end: a real hub, real clients and the TCP data plane
// on loopback. Trainer layouts FSDP(k) and TP(k), reader layouts TP(m), on
// a tiny Llama-shaped model with odd sizes: every rank's slices equal the
// full tensors sliced, byte for byte, and the holders served at most each
// rank's share plus the segment overhead (counted on the holders' own
// served-byte counters).
#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <map>
#include <random>
#include <thread>

#include "client/counted_client.h"
#include "common/convert.h"
#include "common/deadline.h"
#include "common/geometry.h"
#include "common/test_point.h"
#include "hub/hub_service.h"
#include "tensorhub/client.h"
#include "tensorhub/hub.h"
#include "tensorhub/reshard.h"

namespace tensorhub {
namespace {

using Shape = std::vector<uint64_t>;
constexpr uint64_t kSegmentBytes = 512;

using Worker = client::CountedClient;

// The tiny model: names and global shapes (BF16), odd sizes.
std::vector<std::pair<std::string, Shape>> TinyLlama() {
  const uint64_t h = 64, inter = 173, vocab = 517, q = 64, kv = 16;
  std::vector<std::pair<std::string, Shape>> out = {
      {"model.embed_tokens.weight", {vocab, h}}};
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    out.push_back({p + "self_attn.q_proj.weight", {q, h}});
    out.push_back({p + "self_attn.k_proj.weight", {kv, h}});
    out.push_back({p + "self_attn.v_proj.weight", {kv, h}});
    out.push_back({p + "self_attn.q_proj.bias", {q}});
    out.push_back({p + "self_attn.o_proj.weight", {h, q}});
    out.push_back({p + "mlp.gate_proj.weight", {inter, h}});
    out.push_back({p + "mlp.up_proj.weight", {inter, h}});
    out.push_back({p + "mlp.down_proj.weight", {h, inter}});
    out.push_back({p + "input_layernorm.weight", {h}});
  }
  out.push_back({"model.norm.weight", {h}});
  out.push_back({"lm_head.weight", {vocab, h}});
  return out;
}
const ModelDims kDims{8, 2, 8, 0};

// The box of `full` (row-major over `shape`), element by element: the
// reference the fetched slices are compared with.
std::vector<uint16_t> Slice(const std::vector<uint16_t>& full,
                            const Shape& shape, const Box& box) {
  std::vector<uint16_t> out;
  const size_t n = shape.size();
  std::vector<uint64_t> idx(n, 0);
  for (uint64_t i = 0; i < box.Elements(); ++i) {
    uint64_t lin = 0;
    for (size_t d = 0; d < n; ++d)
      lin = lin * shape[d] + box.offset[d] + idx[d];
    out.push_back(full[lin]);
    for (size_t d = n; d-- > 0;) {
      if (++idx[d] < box.extent[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

// An upper bound on what reading `want` of a piece costs: the wanted bytes
// plus one segment row block (whole width) at each end and one column
// block (whole height) at each end.
uint64_t ReadBound(const Box& want, const Box& piece, const std::string& name) {
  const Shape shape = piece.extent;
  const SegmentShape seg = ChooseSegmentShape(
      shape, 2, kSegmentBytes, ClassifyHfTensor(name) == ShardKind::kRow);
  const MatrixView m = MatrixOf(shape);
  return want.Elements() * 2 + 2 * seg.rows * m.cols * 2 +
         2 * seg.cols * m.rows * 2;
}

class ReshardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HubOptions o;
    o.listen_address = "127.0.0.1:0";
    o.rebuild_ms = 0;
    auto hub = hub::HubServer::Start(o);
    ASSERT_TRUE(hub.ok()) << hub.status().ToString();
    hub_ = std::move(hub).value();
    std::mt19937 rng(42);
    for (const auto& [name, shape] : TinyLlama()) {
      std::vector<uint16_t>& t = full_[name];
      t.resize(Box::Whole(shape).Elements());
      for (uint16_t& v : t) v = static_cast<uint16_t>(rng());
    }
  }

  Worker NewWorker(const std::string& name) {
    ClientOptions o;
    o.hub_address = hub_->address();
    o.name = name;
    Result<Worker> w = client::ConnectCounted(o);
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    return w.ok() ? std::move(w).value() : Worker{};
  }

  // Trainer rank r of k publishes its pieces: FSDP rows, or TP slices
  // along each tensor's TP dimension (replicated tensors from rank 0).
  Status PublishRank(Worker& w, const std::string& model, bool fsdp, uint32_t r,
                     uint32_t k) {
    std::vector<TensorRef> refs;
    PublishOptions po;
    po.rank = r;
    po.group_size = k;
    po.segment_bytes = kSegmentBytes;
    for (const auto& [name, shape] : TinyLlama()) {
      Box box;
      if (fsdp) {
        box = FsdpShards(shape, k)[r];
      } else {
        const ShardKind kind = ClassifyHfTensor(name);
        if (kind == ShardKind::kReplicated) {
          box = r == 0 ? Box::Whole(shape)
                       : Box{Shape(shape.size()), Shape(shape.size())};
        } else {
          box = (*TpShards(shape, kind == ShardKind::kRow ? 1 : 0, k))[r];
        }
      }
      if (box.Elements() == 0) continue;
      std::vector<uint16_t>& piece =
          pieces_.emplace_back(Slice(full_[name], shape, box));
      refs.push_back({{name, DType::kBF16, box.extent},
                      piece.data(),
                      piece.size() * 2,
                      MemoryLocation::Host()});
      po.pieces[name] = {shape, box.offset};
    }
    return w.client->Publish(model, Version(1), refs, po);
  }

  std::unique_ptr<hub::HubServer> hub_;
  std::map<std::string, std::vector<uint16_t>> full_;
  std::deque<std::vector<uint16_t>> pieces_;
};

TEST_F(ReshardTest, EveryTrainerLayoutToEveryReaderLayout) {
  std::vector<Worker> trainers, readers;
  for (int i = 0; i < 8; ++i)
    trainers.push_back(NewWorker("t" + std::to_string(i)));
  for (int i = 0; i < 8; ++i)
    readers.push_back(NewWorker("r" + std::to_string(i)));
  for (bool fsdp : {true, false}) {
    for (uint32_t k : {1u, 2u, 4u, 8u}) {
      const std::string model =
          std::string(fsdp ? "fsdp" : "tp") + std::to_string(k);
      for (uint32_t r = 0; r < k; ++r) {
        ASSERT_TRUE(PublishRank(trainers[r], model, fsdp, r, k).ok()) << model;
      }
      for (uint32_t m : {1u, 2u, 4u, 8u}) {
        for (uint32_t rank = 0; rank < m; ++rank) {
          std::vector<TensorSlice> slices;
          std::vector<std::vector<uint16_t>> out;
          out.reserve(64);
          uint64_t bound = 0;
          for (const auto& [name, shape] : TinyLlama()) {
            Result<Box> box = TpRankBox(name, shape, rank, m, kDims);
            ASSERT_TRUE(box.ok()) << box.status().ToString();
            if (box->Elements() == 0) continue;
            std::vector<uint16_t>& o =
                out.emplace_back(box->Elements(), 0xAAAA);
            slices.push_back({{{name, DType::kBF16, box->extent},
                               o.data(),
                               o.size() * 2,
                               MemoryLocation::Host()},
                              *box,
                              {}});
            // The pieces this box meets, by the trainer layout.
            for (uint32_t tr = 0; tr < k; ++tr) {
              Box piece;
              if (fsdp) {
                piece = FsdpShards(shape, k)[tr];
              } else {
                const ShardKind kind = ClassifyHfTensor(name);
                if (kind == ShardKind::kReplicated) {
                  if (tr != 0) continue;
                  piece = Box::Whole(shape);
                } else {
                  piece = (*TpShards(shape, kind == ShardKind::kRow ? 1 : 0,
                                     k))[tr];
                }
              }
              if (auto inter = Intersect(*box, piece)) {
                bound += ReadBound(*inter, piece, name);
              }
            }
          }
          uint64_t before = 0;
          for (uint32_t t = 0; t < k; ++t) before += trainers[t].served();
          // The manifest the reader may take from a trainer is served too,
          // but is not bytes of slices.
          const uint64_t manifest_before = readers[rank].manifest_bytes_read();
          Result<FetchStats> st =
              readers[rank].client->FetchSlices(model, Version(1), slices);
          ASSERT_TRUE(st.ok()) << model << " TP" << m << " rank " << rank
                               << ": " << st.status().ToString();
          // A holder counts a read once its send returned, which may be
          // just after the reader has the bytes: wait (bounded) until the
          // counters have caught up with what the reader received.
          uint64_t served = 0;
          const Deadline caught_up = Deadline::AfterMs(10000);
          do {
            uint64_t total = 0;
            for (uint32_t t = 0; t < k; ++t) total += trainers[t].served();
            const uint64_t other =
                before +
                (readers[rank].manifest_bytes_read() - manifest_before);
            served = total > other ? total - other : 0;
            if (served < st->bytes) std::this_thread::yield();
          } while (served < st->bytes && !caught_up.expired());
          EXPECT_EQ(served, st->bytes);
          EXPECT_LE(served, bound) << model << " TP" << m << " rank " << rank;
          for (size_t i = 0; i < slices.size(); ++i) {
            const std::string& name = slices[i].tensor.spec.name;
            Shape shape;
            for (const auto& [n, s] : TinyLlama()) {
              if (n == name) shape = s;
            }
            ASSERT_EQ(out[i], Slice(full_[name], shape, slices[i].box))
                << model << " TP" << m << " rank " << rank << " " << name;
          }
        }
      }
      for (uint32_t r = 0; r < k; ++r) {
        ASSERT_TRUE(trainers[r].client->Unpublish(model, Version(1)).ok());
      }
    }
  }
}

TEST_F(ReshardTest, ConvertsOnTheWayIn) {
  Worker trainer = NewWorker("t"), reader = NewWorker("r");
  ASSERT_TRUE(PublishRank(trainer, "m", true, 0, 1).ok());
  const std::string name = "model.layers.0.mlp.down_proj.weight";
  const Shape shape{64, 173};
  const Box box = *TpRankBox(name, shape, 1, 4);
  const std::vector<uint16_t> want = Slice(full_[name], shape, box);
  std::vector<float> f32(box.Elements());
  std::vector<uint8_t> f8(box.Elements());
  std::vector<float> scales(box.extent[0], 0.5f);
  std::vector<TensorSlice> slices = {{{{name, DType::kF32, box.extent},
                                       f32.data(),
                                       f32.size() * 4,
                                       MemoryLocation::Host()},
                                      box,
                                      {}}};
  ASSERT_TRUE(reader.client->FetchSlices("m", Version(1), slices).ok());
  for (size_t i = 0; i < want.size(); ++i) {
    const float w = Bf16ToF32(want[i]);
    if (std::isnan(w)) {
      ASSERT_TRUE(std::isnan(f32[i]));
    } else {
      ASSERT_EQ(f32[i], w) << i;
    }
  }
  slices = {{{{name, DType::kF8E4M3, box.extent},
              f8.data(),
              f8.size(),
              MemoryLocation::Host()},
             box,
             scales}};
  ASSERT_TRUE(reader.client->FetchSlices("m", Version(1), slices).ok());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(f8[i], F32ToF8E4M3(Bf16ToF32(want[i]) / 0.5f)) << i;
  }
}

TEST_F(ReshardTest, BadInputGetsAClearErrorAndChangesNothing) {
  Worker trainer = NewWorker("t"), reader = NewWorker("r");
  ASSERT_TRUE(PublishRank(trainer, "m", true, 0, 1).ok());
  const std::string name = "model.norm.weight";
  std::vector<uint16_t> out(8, 0x5555);
  auto fetch = [&](Box box, DType dtype) {
    return reader.client->FetchSlices(
        "m", Version(1),
        {{{{name, dtype, box.extent}, out.data(), 16, MemoryLocation::Host()},
          box,
          {}}});
  };
  Result<FetchStats> st = fetch(Box{{60}, {8}}, DType::kBF16);  // 60..68 of 64
  EXPECT_EQ(st.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.status().message().find("outside"), std::string::npos)
      << st.status().ToString();
  st = fetch(Box{{0}, {8}}, DType::kI16);
  EXPECT_EQ(st.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.status().message().find("cannot convert BF16 to I16"),
            std::string::npos)
      << st.status().ToString();
  st = reader.client->FetchSlices("m", Version(1),
                                  {{{{"no.such", DType::kBF16, {8}},
                                     out.data(),
                                     16,
                                     MemoryLocation::Host()},
                                    Box{{0}, {8}},
                                    {}}});
  EXPECT_NE(st.status().message().find("not part of"), std::string::npos);
  EXPECT_EQ(out, std::vector<uint16_t>(8, 0x5555));
  // Parts that do not tile are refused at commit.
  Worker a = NewWorker("a"), b = NewWorker("b");
  std::vector<uint16_t> rows(4 * 8);
  PublishOptions po;
  po.group_size = 2;
  po.pieces["w"] = {{10, 8}, {0, 0}};
  ASSERT_TRUE(a.client
                  ->Publish("g", Version(1),
                            {{{"w", DType::kBF16, {4, 8}},
                              rows.data(),
                              64,
                              MemoryLocation::Host()}},
                            po)
                  .ok());
  po.rank = 1;
  po.pieces["w"] = {{10, 8}, {5, 0}};  // rows 4..5 missing
  Status s = b.client->Publish(
      "g", Version(1),
      {{{"w", DType::kBF16, {4, 8}}, rows.data(), 64, MemoryLocation::Host()}},
      po);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("no part covers [4:5, 0:8]"), std::string::npos)
      << s.ToString();
}

// A full fetch of a sharded version names the logical tensors (Describe
// lists them with their global shapes) and gets them whole.
TEST_F(ReshardTest, FullFetchOfAShardedVersion) {
  Worker t0 = NewWorker("t0"), t1 = NewWorker("t1"), reader = NewWorker("r");
  ASSERT_TRUE(PublishRank(t0, "m", true, 0, 2).ok());
  ASSERT_TRUE(PublishRank(t1, "m", true, 1, 2).ok());
  Result<VersionInfo> info = reader.client->Describe("m", Version(1));
  ASSERT_TRUE(info.ok());
  ASSERT_EQ(info->tensors.size(), TinyLlama().size());
  std::map<std::string, std::vector<uint16_t>> got;
  std::vector<TensorRef> dest;
  for (const TensorInfo& t : info->tensors) {
    std::vector<uint16_t>& g = got[t.spec.name];
    g.resize(t.bytes / 2);
    dest.push_back({t.spec, g.data(), t.bytes, MemoryLocation::Host()});
  }
  Result<FetchStats> st = reader.client->Fetch("m", Version(1), dest);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  for (const auto& [name, shape] : TinyLlama())
    EXPECT_EQ(got[name], full_[name]) << name;
  // A piece's shape is not the tensor's: refused, naming both.
  dest[1].spec.shape = {1};
  st = reader.client->Fetch("m", Version(1), dest);
  EXPECT_EQ(st.status().code(), StatusCode::kInvalidArgument);
}

// A holder of the box dies mid-read: the rest comes from the other holder.
TEST_F(ReshardTest, FailsOverWhenAHolderDiesMidRead) {
  Worker trainer = NewWorker("t"), full = NewWorker("full"),
         reader = NewWorker("r");
  ASSERT_TRUE(PublishRank(trainer, "m", true, 0, 1).ok());
  // A second complete holder: a reader that fetched everything.
  std::vector<std::vector<uint16_t>> copy;
  std::vector<TensorRef> dest;
  for (const auto& [name, shape] : TinyLlama()) {
    copy.emplace_back(Box::Whole(shape).Elements());
    dest.push_back({{name, DType::kBF16, shape},
                    copy.back().data(),
                    copy.back().size() * 2,
                    MemoryLocation::Host()});
  }
  ASSERT_TRUE(full.client->Fetch("m", Version(1), dest).ok());
  const std::string name = "model.embed_tokens.weight";
  const Shape shape{517, 64};
  const Box box = *TpRankBox(name, shape, 0, 2);
  std::vector<uint16_t> out(box.Elements());
  bool killed = false;
  testpoint::Arm("fetcher.slice_done", [&](uint64_t done) {
    if (done == 1 && !killed) {
      killed = true;
      trainer.client.reset();  // leaves the hub and stops serving
    }
  });
  FetchOptions fo;
  fo.connections = 1;
  fo.max_sources = 1;
  Result<FetchStats> st =
      reader.client->FetchSlices("m", Version(1),
                                 {{{{name, DType::kBF16, box.extent},
                                    out.data(),
                                    out.size() * 2,
                                    MemoryLocation::Host()},
                                   box,
                                   {}}},
                                 fo);
  testpoint::Disarm("fetcher.slice_done");
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_TRUE(killed);
  EXPECT_EQ(out, Slice(full_[name], shape, box));
}

// TP(2) rank r's slices of every tensor, into fresh buffers.
struct RankSlices {
  std::vector<TensorSlice> slices;
  std::deque<std::vector<uint16_t>> out;
};
RankSlices TpSlices(uint32_t rank, uint32_t tp) {
  RankSlices rs;
  for (const auto& [name, shape] : TinyLlama()) {
    Box box = *TpRankBox(name, shape, rank, tp, kDims);
    if (box.Elements() == 0) continue;
    std::vector<uint16_t>& o = rs.out.emplace_back(box.Elements(), 0xAAAA);
    rs.slices.push_back({{{name, DType::kBF16, box.extent},
                          o.data(),
                          o.size() * 2,
                          MemoryLocation::Host()},
                         box,
                         {}});
  }
  return rs;
}

// Bytes a fetch read from `w` (its per-source stats).
uint64_t BytesFrom(const FetchStats& st, const Worker& w) {
  uint64_t n = 0;
  for (const FetchSourceStats& s : st.sources) {
    if (s.worker == w.client->id()) n += s.bytes;
  }
  return n;
}

class SliceHolderTest : public ReshardTest {
 protected:
  void ExpectEqual(const RankSlices& rs) {
    for (size_t i = 0; i < rs.slices.size(); ++i) {
      const std::string& name = rs.slices[i].tensor.spec.name;
      Shape shape;
      for (const auto& [n, s] : TinyLlama()) {
        if (n == name) shape = s;
      }
      ASSERT_EQ(rs.out[i], Slice(full_[name], shape, rs.slices[i].box)) << name;
    }
  }
};

// TP(2) readers of an FSDP(2) trainer serve their slices onward: a third
// reader of a TP(2) rank reads its bytes from the slice holder, a reader
// of everything (TP 1) from both, and the trainers serve less.
TEST_F(SliceHolderTest, ReadersOfSlicesFeedEachOther) {
  Worker t0 = NewWorker("t0"), t1 = NewWorker("t1");
  ASSERT_TRUE(PublishRank(t0, "m", true, 0, 2).ok());
  ASSERT_TRUE(PublishRank(t1, "m", true, 1, 2).ok());
  FetchOptions serve;
  serve.serve_slices = true;
  serve.connections = 1;
  std::vector<Worker> holders;
  std::deque<RankSlices> held;  // registered memory: never moves
  for (uint32_t r = 0; r < 2; ++r) {
    holders.push_back(NewWorker("h" + std::to_string(r)));
    held.push_back(TpSlices(r, 2));
    Result<FetchStats> st =
        holders[r].client->FetchSlices("m", Version(1), held[r].slices, serve);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    ExpectEqual(held[r]);
  }
  // A third reader of TP rank 0: every byte from the holders of slices
  // (one stream, and the hub lists holders of slices first). Holder 1 has
  // the replicated tensors too.
  Worker third = NewWorker("third");
  RankSlices mine = TpSlices(0, 2);
  FetchOptions one;
  one.connections = 1;
  Result<FetchStats> st =
      third.client->FetchSlices("m", Version(1), mine.slices, one);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ExpectEqual(mine);
  EXPECT_GT(BytesFrom(*st, holders[0]), 0u);
  EXPECT_EQ(BytesFrom(*st, holders[0]) + BytesFrom(*st, holders[1]), st->bytes);
  EXPECT_EQ(BytesFrom(*st, t0) + BytesFrom(*st, t1), 0u);
  // A reader of everything (TP 1): each wanted box is cut along the
  // holders' boxes, and every piece comes from one of them.
  Worker whole = NewWorker("whole");
  RankSlices all = TpSlices(0, 1);
  st = whole.client->FetchSlices("m", Version(1), all.slices, one);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ExpectEqual(all);
  EXPECT_GT(BytesFrom(*st, holders[0]), 0u);
  EXPECT_GT(BytesFrom(*st, holders[1]), 0u);
  EXPECT_EQ(BytesFrom(*st, t0) + BytesFrom(*st, t1), 0u);
  // Unpublished, a holder of slices is no longer handed out.
  ASSERT_TRUE(holders[0].client->Unpublish("m", Version(1)).ok());
  Worker fourth = NewWorker("fourth");
  RankSlices again = TpSlices(0, 2);
  st = fourth.client->FetchSlices("m", Version(1), again.slices, one);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ExpectEqual(again);
  EXPECT_EQ(BytesFrom(*st, holders[0]), 0u);
}

// A holder of slices whose memory changed after it registered them is
// caught by the segment checksums it registered, and the reader fails over.
TEST_F(SliceHolderTest, CorruptHolderOfSlicesIsDetectedAndFailedOver) {
  Worker t0 = NewWorker("t0");
  ASSERT_TRUE(PublishRank(t0, "m", true, 0, 1).ok());
  Worker holder = NewWorker("h");
  RankSlices held = TpSlices(1, 2);
  FetchOptions serve;
  serve.serve_slices = true;
  ASSERT_TRUE(
      holder.client->FetchSlices("m", Version(1), held.slices, serve).ok());
  // Corrupt the last tensor it holds (lm_head's vocabulary slice): the
  // reader reads the earlier ones from it, then this one fails its check.
  held.out.back()[7] ^= 0x0100;
  Worker reader = NewWorker("r");
  RankSlices mine = TpSlices(1, 2);
  FetchOptions one;
  one.connections = 1;
  Result<FetchStats> st =
      reader.client->FetchSlices("m", Version(1), mine.slices, one);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ExpectEqual(mine);
  EXPECT_GE(st->chunk_retries, 1u);
  EXPECT_GT(BytesFrom(*st, holder), 0u);
  EXPECT_GT(BytesFrom(*st, t0), 0u);
}

// Holders of slices are soft state: a restarted hub hears of them again
// from the holders' next heartbeat, as of every other reference.
TEST_F(SliceHolderTest, ARestartedHubHearsOfHoldersOfSlicesAgain) {
  Worker t0 = NewWorker("t0");
  ASSERT_TRUE(PublishRank(t0, "m", true, 0, 1).ok());
  Worker holder = NewWorker("h");
  RankSlices held = TpSlices(0, 2);
  FetchOptions serve;
  serve.serve_slices = true;
  ASSERT_TRUE(
      holder.client->FetchSlices("m", Version(1), held.slices, serve).ok());
  const std::string address = hub_->address();
  hub_.reset();
  HubOptions o;
  o.listen_address = address;
  o.rebuild_ms = 0;
  auto hub = hub::HubServer::Start(o);
  ASSERT_TRUE(hub.ok()) << hub.status().ToString();
  hub_ = std::move(hub).value();
  // Until the trainer and the holder have re-reported, a fetch fails or
  // comes from the trainer alone: ask (bounded) until the holder serves.
  Worker reader = NewWorker("r");
  FetchOptions one;
  one.connections = 1;
  one.timeout_ms = 2000;
  const Deadline deadline = Deadline::AfterMs(30000);
  uint64_t from_holder = 0;
  while (from_holder == 0 && !deadline.expired()) {
    RankSlices mine = TpSlices(0, 2);
    Result<FetchStats> st =
        reader.client->FetchSlices("m", Version(1), mine.slices, one);
    if (st.ok()) {
      ExpectEqual(mine);
      from_holder = BytesFrom(*st, holder);
    } else {
      std::this_thread::yield();
    }
  }
  EXPECT_GT(from_holder, 0u);
}

// Every tensor of the model, whole, into fresh buffers (what Describe lists
// of a version of pieces: the logical tensors).
struct WholeModel {
  std::vector<TensorRef> dest;
  std::map<std::string, std::vector<uint16_t>> got;
};
WholeModel WholeBuffers() {
  WholeModel w;
  for (const auto& [name, shape] : TinyLlama()) {
    std::vector<uint16_t>& g = w.got[name];
    g.assign(Box::Whole(shape).Elements(), 0xAAAA);
  }
  for (const auto& [name, shape] : TinyLlama()) {
    std::vector<uint16_t>& g = w.got[name];
    w.dest.push_back({{name, DType::kBF16, shape},
                      g.data(),
                      g.size() * 2,
                      MemoryLocation::Host()});
  }
  return w;
}

// A version two trainer ranks published as pieces, fetched whole by A (as
// any whole fetch, served onward: as a holder of slices whose boxes are the
// whole tensors). Once both ranks withdrew it, A keeps it available: B
// fetches it whole and as slices, every byte from A. A's Unpublish then
// withdraws it (it serves the version), and with nobody left the version is
// UNAVAILABLE.
TEST_F(SliceHolderTest, AWholeFetchOfPiecesServesOnwardAndKeepsTheVersion) {
  Worker t0 = NewWorker("t0"), t1 = NewWorker("t1");
  ASSERT_TRUE(PublishRank(t0, "m", true, 0, 2).ok());
  ASSERT_TRUE(PublishRank(t1, "m", true, 1, 2).ok());
  Worker a = NewWorker("a");
  WholeModel held = WholeBuffers();  // registered memory: never moves
  Result<FetchStats> st = a.client->Fetch("m", Version(1), held.dest);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  for (const auto& [name, shape] : TinyLlama()) {
    ASSERT_EQ(held.got[name], full_[name]) << name;
  }
  ASSERT_TRUE(t0.client->Unpublish("m", Version(1)).ok());
  ASSERT_TRUE(t1.client->Unpublish("m", Version(1)).ok());
  Worker b = NewWorker("b");
  FetchOptions fo;
  fo.serve = false;
  WholeModel mine = WholeBuffers();
  st = b.client->Fetch("m", Version::Latest(), mine.dest, fo);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->version, Version(1));
  for (const auto& [name, shape] : TinyLlama()) {
    EXPECT_EQ(mine.got[name], full_[name]) << name;
  }
  EXPECT_EQ(BytesFrom(*st, a), st->bytes);
  RankSlices slices = TpSlices(1, 2);
  st = b.client->FetchSlices("m", Version(1), slices.slices, fo);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ExpectEqual(slices);
  EXPECT_EQ(BytesFrom(*st, a), st->bytes);
  ASSERT_TRUE(a.client->Unpublish("m", Version(1)).ok());
  st = b.client->Fetch("m", Version(1), mine.dest, fo);
  EXPECT_EQ(st.status().code(), StatusCode::kUnavailable)
      << st.status().ToString();
}

// A version one trainer published whole (no pieces), read by two TP ranks
// that serve their slices: once the trainer withdrew it, the two together
// keep it, and a whole fetch of it reads it as slices from them (then serves
// it as a holder of slices), as does a TP rank of another instance.
TEST_F(SliceHolderTest, ReadersOfSlicesKeepAVersionPublishedWhole) {
  Worker t = NewWorker("t");
  std::vector<TensorRef> refs;
  for (const auto& [name, shape] : TinyLlama()) {
    refs.push_back({{name, DType::kBF16, shape},
                    full_[name].data(),
                    full_[name].size() * 2,
                    MemoryLocation::Host()});
  }
  PublishOptions po;
  po.segment_bytes = kSegmentBytes;
  ASSERT_TRUE(t.client->Publish("m", Version(1), refs, po).ok());
  FetchOptions serve;
  serve.serve_slices = true;
  std::vector<Worker> holders;
  std::deque<RankSlices> held;  // registered memory: never moves
  for (uint32_t r = 0; r < 2; ++r) {
    holders.push_back(NewWorker("h" + std::to_string(r)));
    held.push_back(TpSlices(r, 2));
    ASSERT_TRUE(holders[r]
                    .client->FetchSlices("m", Version(1), held[r].slices, serve)
                    .ok());
  }
  ASSERT_TRUE(t.client->Unpublish("m", Version(1)).ok());
  Worker whole = NewWorker("whole");
  WholeModel mine = WholeBuffers();
  Result<FetchStats> st = whole.client->Fetch("m", Version(1), mine.dest);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  for (const auto& [name, shape] : TinyLlama()) {
    EXPECT_EQ(mine.got[name], full_[name]) << name;
  }
  EXPECT_GT(BytesFrom(*st, holders[0]), 0u);
  EXPECT_GT(BytesFrom(*st, holders[1]), 0u);
  // The TP ranks leave; the whole reader keeps the version for a TP rank
  // of another instance.
  for (Worker& h : holders)
    ASSERT_TRUE(h.client->Unpublish("m", Version(1)).ok());
  Worker next = NewWorker("next");
  RankSlices again = TpSlices(0, 2);
  FetchOptions one;
  one.connections = 1;
  st = next.client->FetchSlices("m", Version(1), again.slices, one);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ExpectEqual(again);
  EXPECT_EQ(BytesFrom(*st, whole), st->bytes);
  ASSERT_TRUE(whole.client->Unpublish("m", Version(1)).ok());
}

}  // namespace
}  // namespace tensorhub
