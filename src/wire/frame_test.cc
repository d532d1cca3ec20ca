// Unit tests for the data-plane frame encoders and decoders.
#include "wire/frame.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace tensorhub::wire {
namespace {

void Put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void Put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void Put16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}

ReadRequest SampleRequest() {
  ReadRequest r;
  r.model = "llama/70b-instruct";
  r.version = 0x0102030405060708ull;
  r.epoch = 0x1122334455667788ull;
  r.part = 0xA1B2C3D4u;
  r.offset = 0x0000FEDCBA987654ull;
  r.length = 123456;
  return r;
}

// Encodes `r` and returns the header bytes (the model name follows them).
std::vector<uint8_t> EncodedHeader(const ReadRequest& r) {
  std::string s = EncodeReadRequest(r);
  return std::vector<uint8_t>(s.begin(), s.end());
}

Status DecodeStatus(const std::vector<uint8_t>& b) {
  ReadRequest out;
  return DecodeReadRequestHeader(b.data(), b.size(), &out).status();
}

TEST(ReadRequestTest, RoundTrip) {
  ReadRequest r = SampleRequest();
  std::string enc = EncodeReadRequest(r);
  ASSERT_EQ(enc.size(), kRequestHeaderBytes + r.model.size());
  EXPECT_EQ(enc.substr(kRequestHeaderBytes), r.model);
  const auto* p = reinterpret_cast<const uint8_t*>(enc.data());
  // Little-endian magic spells "THQ1".
  EXPECT_EQ(enc.substr(0, 4), "THQ1");
  ReadRequest out;
  Result<size_t> n = DecodeReadRequestHeader(p, enc.size(), &out);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, r.model.size());
  EXPECT_EQ(out.version, r.version);
  EXPECT_EQ(out.epoch, r.epoch);
  EXPECT_EQ(out.part, r.part);
  EXPECT_EQ(out.offset, r.offset);
  EXPECT_EQ(out.length, r.length);
  EXPECT_TRUE(out.model.empty()) << "the caller reads the name itself";
}

TEST(ReadRequestTest, StridedRoundTripAndRules) {
  ReadRequest r = SampleRequest();
  r.offset = 100;
  r.run = 16;
  r.stride = 64;
  r.length = 16 * 10;
  std::string enc = EncodeReadRequest(r);
  ASSERT_EQ(enc.size(), kRequestHeaderBytes + r.model.size() + kStrideBytes);
  const auto* p = reinterpret_cast<const uint8_t*>(enc.data());
  ReadRequest out;
  // A holder that does not take strided reads refuses the flag.
  EXPECT_FALSE(DecodeReadRequestHeader(p, enc.size(), &out).ok());
  bool strided = false;
  Result<size_t> n =
      DecodeReadRequestHeader(p, enc.size(), &out, nullptr, nullptr, &strided);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_TRUE(strided);
  ASSERT_TRUE(
      DecodeStride(p + kRequestHeaderBytes + *n, kStrideBytes, &out).ok());
  EXPECT_EQ(out.run, 16u);
  EXPECT_EQ(out.stride, 64u);
  EXPECT_EQ(out.runs(), 10u);
  EXPECT_EQ(out.span_end(), 100u + 9 * 64 + 16);
  // The rules: run divides length, stride >= run, a bounded run count, no
  // overflow.
  auto check = [&](uint64_t length, uint64_t run, uint64_t stride,
                   uint64_t offset = 0) {
    ReadRequest q;
    q.length = length;
    q.offset = offset;
    uint8_t b[16];
    std::memcpy(b, &run, 8);
    std::memcpy(b + 8, &stride, 8);
    return DecodeStride(b, sizeof(b), &q).ok();
  };
  EXPECT_TRUE(check(160, 16, 16));
  EXPECT_FALSE(check(160, 0, 16));
  EXPECT_FALSE(check(161, 16, 64));
  EXPECT_FALSE(check(160, 16, 15));
  EXPECT_FALSE(check((kMaxStridedRuns + 1) * 4, 4, 4));
  EXPECT_TRUE(check(kMaxStridedRuns * 4, 4, 4));
  EXPECT_FALSE(check(48, 16, UINT64_MAX / 2 + 1));  // 2 strides overflow
  EXPECT_FALSE(check(32, 16, 16, UINT64_MAX - 20));
}

TEST(ReadRequestTest, FieldOffsetsAreLittleEndian) {
  ReadRequest r = SampleRequest();
  std::vector<uint8_t> b = EncodedHeader(r);
  EXPECT_EQ(b[4], r.model.size());
  EXPECT_EQ(b[5], 0);
  EXPECT_EQ(b[8], 0x08);   // version low byte
  EXPECT_EQ(b[15], 0x01);  // version high byte
  EXPECT_EQ(b[16], 0x88);  // epoch
  EXPECT_EQ(b[24], 0xD4);  // part
  EXPECT_EQ(b[27], 0xA1);
  for (int i = 28; i < 32; ++i) EXPECT_EQ(b[i], 0) << i;
}

TEST(ReadRequestTest, DecodesOnlyTheHeader) {
  // Exactly the header is enough; the name need not be there yet.
  std::vector<uint8_t> b = EncodedHeader(SampleRequest());
  b.resize(kRequestHeaderBytes);
  EXPECT_TRUE(DecodeStatus(b).ok());
}

TEST(ReadRequestTest, BoundaryValuesAccepted) {
  ReadRequest r = SampleRequest();
  r.model = std::string(kMaxModelNameBytes, 'm');
  r.length = kMaxReadBytes;
  r.offset = UINT64_MAX - kMaxReadBytes;  // offset + length == UINT64_MAX
  std::vector<uint8_t> b = EncodedHeader(r);
  ReadRequest out;
  Result<size_t> n = DecodeReadRequestHeader(b.data(), b.size(), &out);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, kMaxModelNameBytes);
  EXPECT_EQ(out.offset, UINT64_MAX - kMaxReadBytes);

  r.model = "m";
  r.length = 1;
  r.offset = 0;
  EXPECT_TRUE(DecodeStatus(EncodedHeader(r)).ok());
}

TEST(ReadRequestTest, Rejections) {
  const std::vector<uint8_t> good = EncodedHeader(SampleRequest());
  ASSERT_TRUE(DecodeStatus(good).ok());
  auto expect_invalid = [](const std::vector<uint8_t>& b, const char* what) {
    Status s = DecodeStatus(b);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << what;
  };
  for (size_t n = 0; n < kRequestHeaderBytes; ++n) {
    std::vector<uint8_t> b(good.begin(), good.begin() + n);
    expect_invalid(b, "short");
  }
  {
    auto b = good;
    b[0] ^= 1;
    expect_invalid(b, "magic");
    b = good;
    Put32(b.data(), kResponseMagic);
    expect_invalid(b, "response magic on a request");
  }
  {
    auto b = good;
    Put16(b.data() + 4, 0);
    expect_invalid(b, "model_len 0");
    Put16(b.data() + 4, kMaxModelNameBytes + 1);
    expect_invalid(b, "model_len too long");
    Put16(b.data() + 4, 0xFFFF);
    expect_invalid(b, "model_len max");
  }
  for (int bit = 0; bit < 16; ++bit) {
    auto b = good;
    Put16(b.data() + 6, static_cast<uint16_t>(1u << bit));
    expect_invalid(b, "flags");
    // A caller that handles local reads accepts bit 0 only.
    ReadRequest out;
    bool local = false;
    Status s =
        DecodeReadRequestHeader(b.data(), b.size(), &out, &local).status();
    EXPECT_EQ(s.ok(), bit == 0) << "flag bit " << bit;
  }
  for (int bit = 0; bit < 32; ++bit) {
    auto b = good;
    Put32(b.data() + 28, 1u << bit);
    expect_invalid(b, "reserved");
  }
  {
    auto b = good;
    Put64(b.data() + 40, 0);
    expect_invalid(b, "length 0");
    Put64(b.data() + 40, kMaxReadBytes + 1);
    expect_invalid(b, "length too long");
    Put64(b.data() + 40, UINT64_MAX);
    expect_invalid(b, "length max");
  }
  {
    auto b = good;
    Put64(b.data() + 40, 16);
    Put64(b.data() + 32, UINT64_MAX - 15);
    expect_invalid(b, "offset overflows");
    Put64(b.data() + 32, UINT64_MAX);
    expect_invalid(b, "offset max");
    Put64(b.data() + 32, UINT64_MAX - 16);
    EXPECT_TRUE(DecodeStatus(b).ok()) << "ends exactly at UINT64_MAX";
  }
}

TEST(ReadRequestTest, DeltaPartsNameTheirBaseOthersCannot) {
  for (uint32_t part : {kDeltaIndexPart, kDeltaPart}) {
    ReadRequest r = SampleRequest();
    r.part = part;
    r.version = 1000;
    r.base = 997;
    std::vector<uint8_t> b = EncodedHeader(r);
    ReadRequest out;
    ASSERT_TRUE(DecodeReadRequestHeader(b.data(), b.size(), &out).ok());
    EXPECT_EQ(out.base, 997u);
    EXPECT_EQ(out.part, part);
    // base_back 0 (no base), or reaching version 0 or before: refused.
    for (uint32_t back : {0u, 1000u, 1001u, 0xFFFFFFFFu}) {
      Put32(b.data() + 28, back);
      EXPECT_EQ(DecodeStatus(b).code(), StatusCode::kInvalidArgument) << back;
    }
    Put32(b.data() + 28, 999);  // base 1, the oldest there is
    ASSERT_TRUE(DecodeReadRequestHeader(b.data(), b.size(), &out).ok());
    EXPECT_EQ(out.base, 1u);
  }
  // Any other part sends base_back 0 whatever `base` says.
  ReadRequest r = SampleRequest();
  r.base = 5;
  ReadRequest out;
  std::vector<uint8_t> b = EncodedHeader(r);
  ASSERT_TRUE(DecodeReadRequestHeader(b.data(), b.size(), &out).ok());
  EXPECT_EQ(out.base, 0u);
}

TEST(ReadRequestTest, LocalFlagCarriesTheHostIdentityAfterTheName) {
  ReadRequest r = SampleRequest();
  HostIdentity id;
  for (int i = 0; i < 16; ++i) id.boot_id[i] = static_cast<uint8_t>(0xF0 + i);
  id.pid_ns = 0x4026531836ull;
  id.net_ns = 0x4026531840ull;
  std::string enc = EncodeReadRequest(r, &id);
  ASSERT_EQ(enc.size(),
            kRequestHeaderBytes + r.model.size() + kHostIdentityBytes);
  const auto* p = reinterpret_cast<const uint8_t*>(enc.data());
  EXPECT_EQ(p[6], kRequestFlagLocal);
  EXPECT_EQ(p[7], 0);
  EXPECT_EQ(enc.substr(kRequestHeaderBytes, r.model.size()), r.model);
  ReadRequest out;
  bool local = false;
  Result<size_t> n = DecodeReadRequestHeader(p, enc.size(), &out, &local);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_TRUE(local);
  EXPECT_EQ(out.length, r.length);
  const uint8_t* tail = p + kRequestHeaderBytes + *n;
  Result<HostIdentity> got = DecodeHostIdentity(tail, kHostIdentityBytes);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, id);
  EXPECT_EQ(tail[16], 0x36);  // pid_ns, little-endian
  EXPECT_FALSE(DecodeHostIdentity(tail, kHostIdentityBytes - 1).ok());

  // A caller that does not handle local reads refuses the flag.
  EXPECT_EQ(DecodeReadRequestHeader(p, enc.size(), &out).status().code(),
            StatusCode::kInvalidArgument);
  // Without the flag, `local` is cleared.
  std::string plain = EncodeReadRequest(SampleRequest());
  ASSERT_TRUE(
      DecodeReadRequestHeader(reinterpret_cast<const uint8_t*>(plain.data()),
                              plain.size(), &out, &local)
          .ok());
  EXPECT_FALSE(local);
}

TEST(ResponseHeaderTest, LocalHeaderRoundTripAndBounds) {
  ResponseHeader h;
  h.local = true;
  for (size_t pieces : {size_t{1}, size_t{2}, kMaxLocalPieces}) {
    h.payload_len = kLocalReplyHeaderBytes + pieces * kLocalPieceBytes;
    auto enc = EncodeResponseHeader(h);
    EXPECT_EQ(enc[5], kResponseFlagLocal);
    Result<ResponseHeader> d = DecodeResponseHeader(enc.data(), enc.size());
    ASSERT_TRUE(d.ok()) << pieces << ": " << d.status().ToString();
    EXPECT_TRUE(d->local);
    EXPECT_EQ(d->payload_len, h.payload_len);
  }
  auto code = [](ResponseHeader x) {
    auto e = EncodeResponseHeader(x);
    return DecodeResponseHeader(e.data(), e.size()).status().code();
  };
  for (uint64_t bad :
       {uint64_t{0}, uint64_t{kLocalReplyHeaderBytes},
        uint64_t{kLocalReplyHeaderBytes + kLocalPieceBytes - 1},
        uint64_t{kLocalReplyHeaderBytes + kLocalPieceBytes + 1},
        uint64_t{kMaxLocalReplyBytes + kLocalPieceBytes}, kMaxReadBytes}) {
    h.payload_len = bad;
    EXPECT_EQ(code(h), StatusCode::kInvalidArgument) << bad;
  }
  ResponseHeader refused;
  refused.status = StatusCode::kNotFound;
  refused.local = true;
  EXPECT_EQ(code(refused), StatusCode::kInvalidArgument);
  // Other flag bits stay reserved.
  ResponseHeader ok;
  ok.payload_len = 10;
  for (int bit = 1; bit < 8; ++bit) {
    auto e = EncodeResponseHeader(ok);
    e[5] = static_cast<uint8_t>(1u << bit);
    EXPECT_FALSE(DecodeResponseHeader(e.data(), e.size()).ok()) << bit;
  }
}

LocalReply SampleReply() {
  LocalReply r;
  r.pid = 4242;
  r.pieces = {{0x7f0000001000ull, 100}, {0x7f0000100000ull, 4000}, {0x1000, 1}};
  return r;
}

TEST(LocalReplyTest, RoundTripAndLayout) {
  LocalReply r = SampleReply();
  std::string enc = EncodeLocalReply(r);
  ASSERT_EQ(enc.size(), kLocalReplyHeaderBytes + 3 * kLocalPieceBytes);
  EXPECT_EQ(enc.substr(0, 4), "THL1");
  const auto* p = reinterpret_cast<const uint8_t*>(enc.data());
  EXPECT_EQ(p[4], 4242 & 0xFF);
  EXPECT_EQ(p[8], 3);
  Result<LocalReply> d = DecodeLocalReply(p, enc.size(), 4101);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->pid, r.pid);
  EXPECT_EQ(d->pieces, r.pieces);
  // The largest reply.
  LocalReply big;
  big.pid = 1;
  big.pieces.assign(kMaxLocalPieces, {0x1000, 2});
  std::string benc = EncodeLocalReply(big);
  EXPECT_EQ(benc.size(), kMaxLocalReplyBytes);
  EXPECT_TRUE(DecodeLocalReply(reinterpret_cast<const uint8_t*>(benc.data()),
                               benc.size(), 2 * kMaxLocalPieces)
                  .ok());
}

TEST(LocalReplyTest, Rejections) {
  const std::string good = EncodeLocalReply(SampleReply());
  const uint64_t kLen = 4101;
  auto code = [&](const std::string& b, uint64_t len = 4101) {
    return DecodeLocalReply(reinterpret_cast<const uint8_t*>(b.data()),
                            b.size(), len)
        .status()
        .code();
  };
  ASSERT_EQ(code(good), StatusCode::kOk);
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_EQ(code(good.substr(0, n)), StatusCode::kInvalidArgument) << n;
  }
  EXPECT_EQ(code(good + std::string(16, '\0')), StatusCode::kInvalidArgument)
      << "count says 3, size says 4";
  EXPECT_EQ(code(good, kLen - 1), StatusCode::kInvalidArgument) << "too long";
  EXPECT_EQ(code(good, kLen + 1), StatusCode::kInvalidArgument) << "too short";
  auto with = [&](size_t at, uint64_t v, int bytes) {
    std::string b = good;
    for (int i = 0; i < bytes; ++i) b[at + i] = static_cast<char>(v >> (8 * i));
    return b;
  };
  EXPECT_EQ(code(with(0, 0x31504854, 4)), StatusCode::kInvalidArgument)
      << "magic";
  EXPECT_EQ(code(with(4, 0, 4)), StatusCode::kInvalidArgument) << "pid 0";
  EXPECT_EQ(code(with(4, 0x80000000u, 4)), StatusCode::kInvalidArgument)
      << "pid";
  EXPECT_EQ(code(with(8, 0, 4)), StatusCode::kInvalidArgument) << "count 0";
  EXPECT_EQ(code(with(8, kMaxLocalPieces + 1, 4)),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(with(8, 0xFFFFFFFFu, 4)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(with(12, 1, 4)), StatusCode::kInvalidArgument) << "reserved";
  const size_t p0 = kLocalReplyHeaderBytes;
  EXPECT_EQ(code(with(p0, 0, 8)), StatusCode::kInvalidArgument) << "null";
  EXPECT_EQ(code(with(p0 + 8, 0, 8)), StatusCode::kInvalidArgument) << "empty";
  EXPECT_EQ(code(with(p0, UINT64_MAX - 50, 8)), StatusCode::kInvalidArgument)
      << "wraps";
  EXPECT_EQ(code(with(p0 + 8, UINT64_MAX, 8)), StatusCode::kInvalidArgument)
      << "huge length must not wrap the running sum";
  // Too many pieces, even if the lengths would add up.
  LocalReply many;
  many.pid = 1;
  many.pieces.assign(kMaxLocalPieces + 1, {0x1000, 1});
  std::string m = EncodeLocalReply(many);
  EXPECT_EQ(code(m, kMaxLocalPieces + 1), StatusCode::kInvalidArgument);
}

CudaIpcReply SampleIpcReply() {
  CudaIpcReply r;
  r.pid = 777;
  CudaIpcPiece a;
  for (size_t i = 0; i < a.handle.size(); ++i)
    a.handle[i] = static_cast<uint8_t>(i * 3);
  a.offset = 512;
  a.length = 4096;
  a.address = 0x7f0000001000;
  CudaIpcPiece b = a;
  b.handle[0] = 0xEE;
  b.offset = 0;
  b.length = 5;
  b.address = 0x7f0000100000;
  r.pieces = {a, b};
  return r;
}

TEST(CudaIpcTest, RequestFlagRoundTripAndExclusivity) {
  HostIdentity id;
  id.boot_id[0] = 9;
  id.pid_ns = 11;
  id.net_ns = 12;
  ReadRequest req = SampleRequest();
  std::string enc = EncodeReadRequest(req, &id, /*cuda_ipc=*/true);
  const auto* p = reinterpret_cast<const uint8_t*>(enc.data());
  EXPECT_EQ(p[6], kRequestFlagCudaIpc);
  ReadRequest out;
  bool local = true, ipc = false;
  ASSERT_TRUE(DecodeReadRequestHeader(p, enc.size(), &out, &local, &ipc).ok());
  EXPECT_FALSE(local);
  EXPECT_TRUE(ipc);
  // A holder that does not handle CUDA IPC refuses the flag.
  EXPECT_EQ(
      DecodeReadRequestHeader(p, enc.size(), &out, &local).status().code(),
      StatusCode::kInvalidArgument);
  // Both flags at once are refused.
  std::string both = enc;
  both[6] = static_cast<char>(kRequestFlagLocal | kRequestFlagCudaIpc);
  EXPECT_EQ(
      DecodeReadRequestHeader(reinterpret_cast<const uint8_t*>(both.data()),
                              both.size(), &out, &local, &ipc)
          .status()
          .code(),
      StatusCode::kInvalidArgument);
}

TEST(CudaIpcTest, ResponseHeaderAndReplyRoundTripAndRejections) {
  ResponseHeader h;
  h.cuda_ipc = true;
  h.payload_len = kLocalReplyHeaderBytes + 2 * kCudaIpcPieceBytes;
  auto he = EncodeResponseHeader(h);
  Result<ResponseHeader> hd = DecodeResponseHeader(he.data(), he.size());
  ASSERT_TRUE(hd.ok()) << hd.status().ToString();
  EXPECT_TRUE(hd->cuda_ipc);
  EXPECT_FALSE(hd->local);
  auto bad = he;
  bad[5] = kResponseFlagLocal | kResponseFlagCudaIpc;
  EXPECT_FALSE(DecodeResponseHeader(bad.data(), bad.size()).ok())
      << "both flags";
  h.payload_len += 1;
  he = EncodeResponseHeader(h);
  EXPECT_FALSE(DecodeResponseHeader(he.data(), he.size()).ok())
      << "ragged length";
  h.payload_len = kMaxCudaIpcReplyBytes + kCudaIpcPieceBytes;
  he = EncodeResponseHeader(h);
  EXPECT_FALSE(DecodeResponseHeader(he.data(), he.size()).ok()) << "too long";

  const CudaIpcReply r = SampleIpcReply();
  const std::string good = EncodeCudaIpcReply(r);
  ASSERT_EQ(good.size(), kLocalReplyHeaderBytes + 2 * kCudaIpcPieceBytes);
  EXPECT_EQ(good.substr(0, 4), "THG1");
  auto code = [&](const std::string& b, uint64_t len = 4101) {
    return DecodeCudaIpcReply(reinterpret_cast<const uint8_t*>(b.data()),
                              b.size(), len)
        .status()
        .code();
  };
  Result<CudaIpcReply> d = DecodeCudaIpcReply(
      reinterpret_cast<const uint8_t*>(good.data()), good.size(), 4101);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->pid, 777u);
  EXPECT_EQ(d->pieces, r.pieces);
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_EQ(code(good.substr(0, n)), StatusCode::kInvalidArgument) << n;
  }
  EXPECT_EQ(code(good, 4100), StatusCode::kInvalidArgument)
      << "longer than the read";
  EXPECT_EQ(code(good, 4102), StatusCode::kInvalidArgument)
      << "shorter than the read";
  auto with = [&](size_t at, uint64_t v, int bytes) {
    std::string b = good;
    for (int i = 0; i < bytes; ++i) b[at + i] = static_cast<char>(v >> (8 * i));
    return b;
  };
  const size_t p0 = kLocalReplyHeaderBytes;
  EXPECT_EQ(code(with(0, 0x314C4854, 4)), StatusCode::kInvalidArgument)
      << "magic";
  EXPECT_EQ(code(with(4, 0, 4)), StatusCode::kInvalidArgument) << "pid 0";
  EXPECT_EQ(code(with(8, 3, 4)), StatusCode::kInvalidArgument) << "count";
  EXPECT_EQ(code(with(12, 1, 4)), StatusCode::kInvalidArgument) << "reserved";
  EXPECT_EQ(code(with(p0 + 64, UINT64_MAX - 10, 8)),
            StatusCode::kInvalidArgument)
      << "offset wraps";
  EXPECT_EQ(code(with(p0 + 72, 0, 8)), StatusCode::kInvalidArgument) << "empty";
  EXPECT_EQ(code(with(p0 + 72, UINT64_MAX, 8)), StatusCode::kInvalidArgument)
      << "huge";
  EXPECT_EQ(code(with(p0 + 80, 0, 8)), StatusCode::kInvalidArgument)
      << "null address";
  CudaIpcReply many;
  many.pid = 1;
  many.pieces.assign(kMaxCudaIpcPieces + 1, r.pieces[1]);
  many.pieces[0].length = 1;
  for (auto& piece : many.pieces) piece.length = 1;
  EXPECT_EQ(code(EncodeCudaIpcReply(many), kMaxCudaIpcPieces + 1),
            StatusCode::kInvalidArgument);
}

TEST(ReleaseTest, RoundTripAndRejections) {
  for (ReleaseOutcome o :
       {ReleaseOutcome::kCopied, ReleaseOutcome::kNotCopied}) {
    auto e = EncodeRelease(o);
    EXPECT_EQ(std::memcmp(e.data(), "THR1", 4), 0);
    Result<ReleaseOutcome> d = DecodeRelease(e.data(), e.size());
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(*d, o);
    EXPECT_FALSE(DecodeRelease(e.data(), e.size() - 1).ok());
  }
  auto e = EncodeRelease(ReleaseOutcome::kCopied);
  auto b = e;
  b[1] ^= 1;
  EXPECT_FALSE(DecodeRelease(b.data(), b.size()).ok()) << "magic";
  b = e;
  b[4] = 2;
  EXPECT_FALSE(DecodeRelease(b.data(), b.size()).ok()) << "outcome";
  b = e;
  b[15] = 1;
  EXPECT_FALSE(DecodeRelease(b.data(), b.size()).ok()) << "reserved";
}

TEST(ResponseHeaderTest, RoundTripEveryKnownStatus) {
  const StatusCode codes[] = {StatusCode::kOk,
                              StatusCode::kInvalidArgument,
                              StatusCode::kDeadlineExceeded,
                              StatusCode::kNotFound,
                              StatusCode::kAlreadyExists,
                              StatusCode::kPermissionDenied,
                              StatusCode::kResourceExhausted,
                              StatusCode::kFailedPrecondition,
                              StatusCode::kAborted,
                              StatusCode::kInternal,
                              StatusCode::kUnavailable,
                              StatusCode::kDataLoss};
  for (StatusCode c : codes) {
    ResponseHeader h;
    h.status = c;
    h.message_len = c == StatusCode::kOk ? 0 : 17;
    h.payload_len = c == StatusCode::kOk ? 987654321 : 0;
    auto enc = EncodeResponseHeader(h);
    EXPECT_EQ(std::memcmp(enc.data(), "THP1", 4), 0);
    Result<ResponseHeader> d = DecodeResponseHeader(enc.data(), enc.size());
    ASSERT_TRUE(d.ok()) << StatusCodeName(c) << ": " << d.status().ToString();
    EXPECT_EQ(d->status, c);
    EXPECT_EQ(d->message_len, h.message_len);
    EXPECT_EQ(d->payload_len, h.payload_len);
  }
}

TEST(ResponseHeaderTest, BoundaryValuesAccepted) {
  ResponseHeader h;
  h.payload_len = kMaxReadBytes;
  auto enc = EncodeResponseHeader(h);
  Result<ResponseHeader> d = DecodeResponseHeader(enc.data(), enc.size());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->payload_len, kMaxReadBytes);
  // A refusal carries the longest message and no payload.
  ResponseHeader r;
  r.status = StatusCode::kNotFound;
  r.message_len = kMaxMessageBytes;
  auto renc = EncodeResponseHeader(r);
  d = DecodeResponseHeader(renc.data(), renc.size());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->message_len, kMaxMessageBytes);
}

TEST(ResponseHeaderTest, SuccessWithMessageOrReservedBytesRejected) {
  ResponseHeader h;
  h.message_len = 1;
  auto enc = EncodeResponseHeader(h);
  EXPECT_FALSE(DecodeResponseHeader(enc.data(), enc.size()).ok());
  ResponseHeader ok;
  auto e2 = EncodeResponseHeader(ok);
  e2[5] = 1;
  EXPECT_FALSE(DecodeResponseHeader(e2.data(), e2.size()).ok());
  e2[5] = 0;
  e2[20] = 1;
  EXPECT_FALSE(DecodeResponseHeader(e2.data(), e2.size()).ok());
}

TEST(ResponseHeaderTest, Rejections) {
  ResponseHeader ok;
  ok.payload_len = 100;
  const auto enc = EncodeResponseHeader(ok);
  const std::vector<uint8_t> good(enc.begin(), enc.end());
  auto code = [](const std::vector<uint8_t>& b) {
    return DecodeResponseHeader(b.data(), b.size()).status().code();
  };
  ASSERT_EQ(code(good), StatusCode::kOk);
  for (size_t n = 0; n < kResponseHeaderBytes; ++n) {
    std::vector<uint8_t> b(good.begin(), good.begin() + n);
    EXPECT_EQ(code(b), StatusCode::kInvalidArgument) << "short " << n;
  }
  {
    auto b = good;
    b[3] ^= 0x80;
    EXPECT_EQ(code(b), StatusCode::kInvalidArgument) << "magic";
    Put32(b.data(), kRequestMagic);
    EXPECT_EQ(code(b), StatusCode::kInvalidArgument) << "request magic";
  }
  // Unknown status bytes: every value that is not a StatusCode.
  for (int s = 0; s < 256; ++s) {
    auto b = good;
    Put64(b.data() + 8, 0);  // so that failed codes are otherwise valid
    b[4] = static_cast<uint8_t>(s);
    bool known = s == 0 || (s >= 3 && s <= 10) || s == 13 || s == 14 || s == 15;
    EXPECT_EQ(code(b) == StatusCode::kOk, known) << "status " << s;
  }
  {
    auto b = good;
    Put16(b.data() + 6, kMaxMessageBytes + 1);
    EXPECT_EQ(code(b), StatusCode::kInvalidArgument) << "message too long";
    Put16(b.data() + 6, 0xFFFF);
    EXPECT_EQ(code(b), StatusCode::kInvalidArgument) << "message max";
  }
  {
    auto b = good;
    Put64(b.data() + 8, kMaxReadBytes + 1);
    EXPECT_EQ(code(b), StatusCode::kInvalidArgument) << "payload too long";
    Put64(b.data() + 8, UINT64_MAX);
    EXPECT_EQ(code(b), StatusCode::kInvalidArgument) << "payload max";
  }
  {
    ResponseHeader failed;
    failed.status = StatusCode::kNotFound;
    failed.message_len = 10;
    failed.payload_len = 1;
    auto e = EncodeResponseHeader(failed);
    EXPECT_EQ(DecodeResponseHeader(e.data(), e.size()).status().code(),
              StatusCode::kInvalidArgument)
        << "failed response with payload";
  }
}

// Random bytes: the decoders must never crash, and whatever they accept must
// be within the documented bounds.
TEST(FrameFuzzTest, RandomBytesNeverCrashAndAcceptedValuesInBounds) {
  std::mt19937_64 rng(0x7e45011b);
  const std::vector<uint8_t> req_seed = EncodedHeader(SampleRequest());
  ResponseHeader rh;
  rh.payload_len = 5;
  const auto resp_enc = EncodeResponseHeader(rh);
  const std::vector<uint8_t> resp_seed(resp_enc.begin(), resp_enc.end());
  int req_accepted = 0, resp_accepted = 0, reply_accepted = 0;
  const std::string reply_seed = EncodeLocalReply(SampleReply());
  for (int iter = 0; iter < 200000; ++iter) {
    // Half purely random, half a valid frame with a few bytes mutated, so
    // that the deeper checks are reached too.
    const bool mutate = iter % 2 == 1;
    const bool request = (iter / 2) % 2 == 0;
    const std::vector<uint8_t>& seed = request ? req_seed : resp_seed;
    size_t size = rng() % (seed.size() + 8);
    std::vector<uint8_t> b(size);
    for (size_t i = 0; i < size; ++i) {
      b[i] = mutate && i < seed.size() ? seed[i] : static_cast<uint8_t>(rng());
    }
    if (mutate && size > 0) {
      int flips = 1 + static_cast<int>(rng() % 3);
      for (int f = 0; f < flips; ++f) {
        b[rng() % size] = static_cast<uint8_t>(rng());
      }
    }
    {
      // The same bytes as a local reply (and, mutated from a valid one, so
      // that acceptance is reached), and as a release.
      std::vector<uint8_t> rb(b);
      if (mutate) {
        rb.assign(reply_seed.begin(), reply_seed.end());
        rb[rng() % rb.size()] = static_cast<uint8_t>(rng());
      }
      const uint64_t len = mutate ? 4101 : 1 + rng() % 8192;
      Result<LocalReply> lr = DecodeLocalReply(rb.data(), rb.size(), len);
      if (lr.ok()) {
        ++reply_accepted;
        ASSERT_GE(lr->pieces.size(), 1u);
        ASSERT_LE(lr->pieces.size(), kMaxLocalPieces);
        ASSERT_GT(lr->pid, 0u);
        uint64_t sum = 0;
        for (const LocalPiece& piece : lr->pieces) {
          ASSERT_GT(piece.length, 0u);
          ASSERT_NE(piece.address, 0u);
          ASSERT_LE(piece.address, UINT64_MAX - piece.length);
          sum += piece.length;
        }
        ASSERT_EQ(sum, len);
      }
      Result<ReleaseOutcome> rel = DecodeRelease(b.data(), b.size());
      if (rel.ok()) {
        ASSERT_LE(static_cast<uint32_t>(*rel), 1u);
      }
    }
    if (request) {
      ReadRequest out;
      Result<size_t> n = DecodeReadRequestHeader(b.data(), b.size(), &out);
      if (n.ok()) {
        ++req_accepted;
        ASSERT_GE(b.size(), kRequestHeaderBytes);
        ASSERT_GE(*n, 1u);
        ASSERT_LE(*n, kMaxModelNameBytes);
        ASSERT_GE(out.length, 1u);
        ASSERT_LE(out.length, kMaxReadBytes);
        ASSERT_LE(out.offset, UINT64_MAX - out.length);
        bool local = true;
        ASSERT_TRUE(
            DecodeReadRequestHeader(b.data(), b.size(), &out, &local).ok());
        ASSERT_FALSE(local) << "accepted without `local` means no flag";
      }
    } else {
      Result<ResponseHeader> h = DecodeResponseHeader(b.data(), b.size());
      if (h.ok()) {
        ++resp_accepted;
        ASSERT_GE(b.size(), kResponseHeaderBytes);
        ASSERT_LE(h->message_len, kMaxMessageBytes);
        ASSERT_LE(h->payload_len, kMaxReadBytes);
        ASSERT_NE(StatusCodeName(h->status), "UNKNOWN");
        if (h->status != StatusCode::kOk) {
          ASSERT_EQ(h->payload_len, 0u);
          ASSERT_FALSE(h->local);
        }
        if (h->local) {
          ASSERT_GE(h->payload_len, kLocalReplyHeaderBytes + kLocalPieceBytes);
          ASSERT_LE(h->payload_len, kMaxLocalReplyBytes);
          ASSERT_EQ(
              (h->payload_len - kLocalReplyHeaderBytes) % kLocalPieceBytes, 0u);
        }
      }
    }
  }
  // The mutated half must reach acceptance sometimes, or the bounds above
  // were never exercised.
  EXPECT_GT(req_accepted, 100);
  EXPECT_GT(resp_accepted, 100);
  EXPECT_GT(reply_accepted, 100);
}

}  // namespace
}  // namespace tensorhub::wire

namespace tensorhub::wire {
namespace {

TEST(HandshakeFrameTest, RoundTripsAndRejections) {
  Nonce n{};
  for (size_t i = 0; i < n.size(); ++i) n[i] = static_cast<uint8_t>(i * 7);
  auto c = EncodeChallenge(n);
  Result<Nonce> dn = DecodeChallenge(c.data(), c.size());
  ASSERT_TRUE(dn.ok());
  EXPECT_EQ(*dn, n);
  EXPECT_FALSE(DecodeChallenge(c.data(), c.size() - 1).ok());
  c[4] = 2;  // unknown version
  EXPECT_NE(
      DecodeChallenge(c.data(), c.size()).status().message().find("version"),
      std::string::npos);
  // The holder's first frame is a Challenge or StartTls, the same length.
  c[4] = 1;
  Result<HolderHello> hc = DecodeHolderHello(c.data(), c.size());
  ASSERT_TRUE(hc.ok());
  EXPECT_FALSE(hc->start_tls);
  EXPECT_EQ(hc->nonce, n);
  auto t = EncodeStartTls();
  static_assert(sizeof(t) == kChallengeBytes);
  Result<HolderHello> ht = DecodeHolderHello(t.data(), t.size());
  ASSERT_TRUE(ht.ok());
  EXPECT_TRUE(ht->start_tls);
  EXPECT_FALSE(DecodeChallenge(t.data(), t.size()).ok());
  EXPECT_FALSE(DecodeHolderHello(t.data(), t.size() - 1).ok());
  t[4] = 9;
  EXPECT_NE(
      DecodeHolderHello(t.data(), t.size()).status().message().find("version"),
      std::string::npos);
  Mac m{};
  m[0] = 1;
  auto p = EncodeProof(m);
  ASSERT_TRUE(DecodeProof(p.data(), p.size()).ok());
  EXPECT_EQ(*DecodeProof(p.data(), p.size()), m);
  p[0] ^= 1;
  EXPECT_FALSE(DecodeProof(p.data(), p.size()).ok());
  // RESOURCE_EXHAUSTED: the proof was right, the holder serves as many
  // readers as it may.
  for (StatusCode code : {StatusCode::kOk, StatusCode::kPermissionDenied,
                          StatusCode::kResourceExhausted}) {
    auto v = EncodeVerdict(code);
    ASSERT_TRUE(DecodeVerdict(v.data(), v.size()).ok());
    EXPECT_EQ(*DecodeVerdict(v.data(), v.size()), code);
  }
  auto bad = EncodeVerdict(StatusCode::kInternal);
  EXPECT_FALSE(DecodeVerdict(bad.data(), bad.size()).ok());
  auto res = EncodeVerdict(StatusCode::kOk);
  res[6] = 1;
  EXPECT_FALSE(DecodeVerdict(res.data(), res.size()).ok());
}

}  // namespace
}  // namespace tensorhub::wire
