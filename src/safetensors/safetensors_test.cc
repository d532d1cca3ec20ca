#include "safetensors/safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "safetensors/hf_checkpoint.h"

namespace tensorhub {
namespace {

using Metadata = std::vector<std::pair<std::string, std::string>>;

std::string LengthPrefix(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out;
}

// A whole file: length prefix, `json`, then `data_bytes` bytes of data.
std::string MakeFile(const std::string& json, uint64_t data_bytes) {
  return LengthPrefix(json.size()) + json + std::string(data_bytes, '\x5a');
}

Result<SafetensorsHeader> Parse(const std::string& file) {
  return ParseSafetensorsHeader(reinterpret_cast<const uint8_t*>(file.data()),
                                file.size(), file.size());
}

std::vector<TensorSpec> SampleSpecs() {
  return {
      {"embed.weight", DType::kBF16, {4, 3}},
      {"layers.0.attn.q_proj", DType::kF32, {2, 2, 2}},
      {"empty", DType::kF16, {0, 5}},
      {"scalar", DType::kI64, {}},
      {"mask", DType::kBool, {3}},
      {"fp8", DType::kF8E4M3, {5}},
  };
}

TEST(SafetensorsBuildTest, RoundTripThroughParse) {
  const std::vector<TensorSpec> specs = SampleSpecs();
  const Metadata metadata = {
      {"format", "pt"},
      {"quote\"back\\slash", "tab\tnl\n\x01 caf\xc3\xa9"},
      {"emoji", "\xf0\x9f\x98\x80"}};
  Result<std::string> header = BuildSafetensorsHeader(specs, metadata);
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  EXPECT_EQ(header->size() % 8, 0u);

  uint64_t data_bytes = 0;
  for (const auto& s : specs) data_bytes += *s.ByteSize();
  const std::string file = *header + std::string(data_bytes, '\0');
  Result<SafetensorsHeader> parsed = Parse(file);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->data_start, header->size());
  EXPECT_EQ(parsed->metadata, metadata);
  // Laid out contiguously in spec order, so sorted by offset is spec order
  // (the zero-byte "empty" sorts by (begin, end) among its neighbours).
  ASSERT_EQ(parsed->tensors.size(), specs.size());
  uint64_t offset = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const SafetensorsEntry& e = parsed->tensors[i];
    EXPECT_EQ(e.spec, specs[i]) << i;
    EXPECT_EQ(e.begin, offset) << i;
    offset += *specs[i].ByteSize();
    EXPECT_EQ(e.end, offset) << i;
  }
}

TEST(SafetensorsBuildTest, ExactBytesMatchReferenceLayout) {
  Result<std::string> header =
      BuildSafetensorsHeader({{"a", DType::kF32, {1, 2}}}, {});
  ASSERT_TRUE(header.ok());
  const std::string json =
      R"({"a":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]}})";
  std::string padded = json + std::string((8 - json.size() % 8) % 8, ' ');
  EXPECT_EQ(*header, LengthPrefix(padded.size()) + padded);
}

TEST(SafetensorsBuildTest, EmptyFile) {
  Result<std::string> header = BuildSafetensorsHeader({}, {});
  ASSERT_TRUE(header.ok());
  Result<SafetensorsHeader> parsed = Parse(*header);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_TRUE(parsed->tensors.empty());
  EXPECT_TRUE(parsed->metadata.empty());
}

TEST(SafetensorsBuildTest, RejectsBadSpecs) {
  struct Case {
    std::vector<TensorSpec> specs;
    Metadata metadata;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{{"a", DType::kU8, {1}}, {"a", DType::kU8, {1}}}, {}, "duplicate"},
      {{{"__metadata__", DType::kU8, {1}}}, {}, "reserved"},
      {{{"a", DType::kU8, std::vector<uint64_t>(17, 1)}}, {}, "rank"},
      {{{"a", DType::kF64, {1ull << 32, 1ull << 32}}}, {}, "overflow"},
      {{{"a", DType::kU8, {1ull << 63}}, {"b", DType::kU8, {1ull << 63}}},
       {},
       "overflow"},
      {{{"bad\xff", DType::kU8, {1}}}, {}, "UTF-8"},
      {{}, {{"k", "v"}, {"k", "w"}}, "duplicate metadata key"},
      {{}, {{"k", "\xc3"}}, "UTF-8"},
  };
  for (const Case& c : cases) {
    Result<std::string> r = BuildSafetensorsHeader(c.specs, c.metadata);
    ASSERT_FALSE(r.ok()) << c.expected;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.expected), std::string::npos)
        << r.status().message();
  }
}

TEST(SafetensorsParseTest, AcceptsHandWrittenHeader) {
  // Out-of-order offsets, whitespace, escapes, a surrogate pair, metadata
  // last, trailing padding.
  const std::string json =
      " {\n \"b\\u00e9\\ud83d\\ude00\" : {\"shape\": [2], \"dtype\": \"U16\","
      " \"data_offsets\": [4, 8]},\r\n\t\"a\\/\\n\": {\"data_offsets\":[0,4],"
      "\"dtype\":\"U8\",\"shape\":[2,2]}, \"__metadata__\": {\"k\": \"v\"}}   ";
  Result<SafetensorsHeader> h = Parse(MakeFile(json, 8));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_EQ(h->tensors.size(), 2u);
  EXPECT_EQ(h->tensors[0].spec.name, "a/\n");
  EXPECT_EQ(h->tensors[0].spec.shape, (std::vector<uint64_t>{2, 2}));
  EXPECT_EQ(h->tensors[1].spec.name, "b\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_EQ(h->tensors[1].spec.dtype, DType::kU16);
  EXPECT_EQ(h->tensors[1].begin, 4u);
  EXPECT_EQ(h->metadata, (Metadata{{"k", "v"}}));
  EXPECT_EQ(h->data_start, 8 + json.size());
}

TEST(SafetensorsParseTest, BufferMayHoldOnlyTheHeader) {
  Result<std::string> header =
      BuildSafetensorsHeader({{"a", DType::kF32, {1000}}}, {});
  ASSERT_TRUE(header.ok());
  Result<SafetensorsHeader> h =
      ParseSafetensorsHeader(reinterpret_cast<const uint8_t*>(header->data()),
                             header->size(), header->size() + 4000);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  // Missing header bytes are reported, not read.
  Result<SafetensorsHeader> cut =
      ParseSafetensorsHeader(reinterpret_cast<const uint8_t*>(header->data()),
                             header->size() - 1, header->size() + 4000);
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find("header bytes given"),
            std::string::npos);
}

struct BadFile {
  const char* label;
  std::string file;
  const char* expected;  // substring of the error message
};

std::vector<BadFile> BadFiles() {
  const std::string t =
      R"("t":{"dtype":"F32","shape":[3],"data_offsets":[0,12]})";
  std::string deep = "{\"__metadata__\":{\"k\":\"v\"},\"x\":";
  deep += std::string(70, '[') + std::string(70, ']') + "}";
  return {
      {"empty", "", "shorter than the 8-byte"},
      {"seven bytes", std::string(7, '\0'), "shorter than the 8-byte"},
      {"huge length", LengthPrefix((100ull << 20) + 1) + "{}",
       "exceeds the limit"},
      {"max length", LengthPrefix(~0ull) + "{}", "exceeds the limit"},
      {"length past file", LengthPrefix(3) + "{}", "that follow it"},
      {"empty json", MakeFile("", 0), "unexpected end"},
      {"not json", MakeFile("{nope}", 0), "invalid JSON"},
      {"truncated", MakeFile("{\"t\":{\"dtype\":", 0), "invalid JSON"},
      {"trailing garbage", MakeFile("{} x", 0), "trailing characters"},
      {"two values", MakeFile("{}{}", 0), "trailing characters"},
      {"not an object", MakeFile("[]", 0), "not a JSON object"},
      {"string", MakeFile("\"x\"", 0), "not a JSON object"},
      {"bad utf8", MakeFile("{\"\xff\":1}", 0), "invalid UTF-8"},
      {"overlong utf8", MakeFile("{\"\xc0\xaf\":1}", 0), "invalid UTF-8"},
      {"raw control", MakeFile("{\"a\nb\":1}", 0), "control character"},
      {"bad escape", MakeFile(R"({"\q":1})", 0), "invalid escape"},
      {"short \\u", MakeFile(R"({"\u12":1})", 0), "hex digit"},
      {"lone high surrogate", MakeFile(R"({"\ud800":1})", 0), "surrogate"},
      {"lone low surrogate", MakeFile(R"({"\udc00":1})", 0), "surrogate"},
      {"leading zero", MakeFile(R"({"x":[01]})", 0), "leading zero"},
      {"bad number", MakeFile(R"({"x":[1.]})", 0), "malformed number"},
      {"too deep", MakeFile(deep, 0), "nesting deeper than 64"},
      {"unknown dtype",
       MakeFile(R"({"t":{"dtype":"F33","shape":[3],"data_offsets":[0,12]}})",
                12),
       "unknown dtype 'F33'"},
      {"dtype not string",
       MakeFile(R"({"t":{"dtype":4,"shape":[3],"data_offsets":[0,12]}})", 12),
       "dtype is not a string"},
      {"shape not array",
       MakeFile(R"({"t":{"dtype":"F32","shape":3,"data_offsets":[0,12]}})", 12),
       "shape is not an array"},
      {"negative dim",
       MakeFile(R"({"t":{"dtype":"F32","shape":[-3],"data_offsets":[0,12]}})",
                12),
       "negative"},
      {"float dim",
       MakeFile(R"({"t":{"dtype":"F32","shape":[3.0],"data_offsets":[0,12]}})",
                12),
       "non-integer"},
      {"exponent dim",
       MakeFile(R"({"t":{"dtype":"F32","shape":[3e0],"data_offsets":[0,12]}})",
                12),
       "non-integer"},
      {"string dim",
       MakeFile(R"({"t":{"dtype":"F32","shape":["3"],"data_offsets":[0,12]}})",
                12),
       "non-number"},
      {"dim above u64",
       MakeFile(R"({"t":{"dtype":"U8","shape":[18446744073709551616],)"
                R"("data_offsets":[0,0]}})",
                0),
       "exceeds 2^64-1"},
      {"rank 17",
       MakeFile(R"({"t":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,)"
                R"(1,1,1],"data_offsets":[0,1]}})",
                1),
       "rank exceeds 16"},
      {"byte size overflow",
       MakeFile(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],)"
                R"("data_offsets":[0,0]}})",
                0),
       "overflows"},
      {"one offset",
       MakeFile(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0]}})", 12),
       "data_offsets is not an array of 2"},
      {"three offsets",
       MakeFile(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,12,1]}})",
                12),
       "data_offsets is not an array of 2"},
      {"negative offset",
       MakeFile(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[-1,12]}})",
                12),
       "negative"},
      {"begin after end",
       MakeFile(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[12,0]}})",
                12),
       "begin > end"},
      {"end beyond data",
       MakeFile(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})",
                11),
       "end beyond the data section (11 bytes)"},
      {"size mismatch",
       MakeFile(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,10]}})",
                10),
       "tensor 't' data_offsets [0, 10) do not match dtype F32 shape [3] "
       "(12 bytes)"},
      {"duplicate name", MakeFile("{" + t + "," + t + "}", 12),
       "duplicate tensor name 't'"},
      {"overlap",
       MakeFile(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
                6),
       "overlap"},
      {"hole",
       MakeFile(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                R"("b":{"dtype":"U8","shape":[4],"data_offsets":[6,10]}})",
                10),
       "data bytes [4, 6) before tensor 'b' belong to no tensor"},
      {"hole at start",
       MakeFile(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})", 6),
       "data bytes [0, 2)"},
      {"trailing data",
       MakeFile(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 5),
       "data bytes [4, 5) at the end"},
      {"data without tensors", MakeFile("{}", 1), "data bytes [0, 1)"},
      {"metadata value not string", MakeFile(R"({"__metadata__":{"k":1}})", 0),
       "__metadata__ value for key 'k' is not a string"},
      {"metadata not object", MakeFile(R"({"__metadata__":"x"})", 0),
       "__metadata__ is not an object"},
      {"metadata null", MakeFile(R"({"__metadata__":null})", 0),
       "__metadata__ is not an object"},
      {"duplicate metadata",
       MakeFile(R"({"__metadata__":{},"__metadata__":{}})", 0),
       "duplicate key '__metadata__'"},
      {"duplicate metadata key",
       MakeFile(R"({"__metadata__":{"k":"a","k":"b"}})", 0),
       "duplicate __metadata__ key 'k'"},
      {"unexpected key",
       MakeFile(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,12],)"
                R"("extra":1}})",
                12),
       "tensor 't': unexpected key 'extra'"},
      {"duplicate key",
       MakeFile(R"({"t":{"dtype":"F32","dtype":"F32","shape":[3],)"
                R"("data_offsets":[0,12]}})",
                12),
       "duplicate key 'dtype'"},
      {"missing shape",
       MakeFile(R"({"t":{"dtype":"F32","data_offsets":[0,12]}})", 12),
       "missing shape"},
      {"tensor not object", MakeFile(R"({"t":[1]})", 0),
       "tensor 't' is not an object"},
  };
}

TEST(SafetensorsParseTest, RejectsEachMalformedFile) {
  for (const BadFile& bad : BadFiles()) {
    SCOPED_TRACE(bad.label);
    Result<SafetensorsHeader> h = Parse(bad.file);
    ASSERT_FALSE(h.ok());
    EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(h.status().message().find(bad.expected), std::string::npos)
        << "message: " << h.status().message();
  }
}

TEST(SafetensorsParseTest, LongNamesAreCutInMessages) {
  const std::string name(10000, 'n');
  const std::string json = "{\"" + name + "\":{\"dtype\":\"F32\"}}";
  Result<SafetensorsHeader> h = Parse(MakeFile(json, 0));
  ASSERT_FALSE(h.ok());
  EXPECT_LT(h.status().message().size(), 300u) << h.status().message();
}

TEST(SafetensorsParseTest, BufferLargerThanFileIsRejected) {
  const std::string file = MakeFile("{}", 0);
  Result<SafetensorsHeader> h =
      ParseSafetensorsHeader(reinterpret_cast<const uint8_t*>(file.data()),
                             file.size(), file.size() - 1);
  EXPECT_FALSE(h.ok());
}

// Seeded mutation of a valid file: every result must be a clean OK or
// INVALID_ARGUMENT (sanitizers catch the rest). Replays from the seed.
TEST(SafetensorsParseTest, SurvivesSeededMutations) {
  Result<std::string> header =
      BuildSafetensorsHeader(SampleSpecs(), {{"format", "pt"}});
  ASSERT_TRUE(header.ok());
  uint64_t data_bytes = 0;
  for (const auto& s : SampleSpecs()) data_bytes += *s.ByteSize();
  const std::string valid = *header + std::string(data_bytes, '\0');
  ASSERT_TRUE(Parse(valid).ok());

  std::mt19937_64 rng(20240607);
  int ok_count = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string f = valid;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < edits; ++k) {
      const size_t pos = rng() % f.size();
      switch (rng() % 3) {
        case 0:
          f[pos] = static_cast<char>(rng());
          break;
        case 1:
          f.erase(pos, 1 + rng() % 8);
          break;
        default:
          f.insert(pos, 1, "{}[],:\"\\0-1e."[rng() % 13]);
          break;
      }
      if (f.empty()) break;
    }
    Result<SafetensorsHeader> h = Parse(f);
    if (h.ok()) {
      ++ok_count;
    } else {
      EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument) << iter;
    }
  }
  // Some mutations only touch data or padding; many must fail.
  EXPECT_GT(ok_count, 0);
  EXPECT_LT(ok_count, 20000);
}

// ---- Files ----

class SafetensorsFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/safetensors_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    for (const std::string& p : created_) ::unlink(p.c_str());
    ::rmdir(dir_.c_str());
  }
  std::string Path(const std::string& name) {
    std::string p = dir_ + "/" + name;
    created_.push_back(p);
    created_.push_back(p + ".partial");
    return p;
  }
  static bool Exists(const std::string& p) {
    struct stat st;
    return ::stat(p.c_str(), &st) == 0;
  }

  std::string dir_;
  std::vector<std::string> created_;
};

TEST_F(SafetensorsFileTest, WriteCommitThenMap) {
  const std::string path = Path("model.safetensors");
  const std::vector<TensorSpec> specs = SampleSpecs();
  const Metadata metadata = {{"format", "pt"}};
  {
    Result<SafetensorsFileWriter> w =
        SafetensorsFileWriter::Create(path, specs, metadata);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    EXPECT_TRUE(Exists(path + ".partial"));
    EXPECT_FALSE(Exists(path));
    std::vector<TensorRef> refs = w->tensors();
    ASSERT_EQ(refs.size(), specs.size());
    for (size_t i = 0; i < refs.size(); ++i) {
      EXPECT_EQ(refs[i].spec, specs[i]);
      EXPECT_EQ(refs[i].bytes, *specs[i].ByteSize());
      auto* p = static_cast<uint8_t*>(refs[i].data);
      for (uint64_t b = 0; b < refs[i].bytes; ++b) {
        p[b] = static_cast<uint8_t>(i * 31 + b);
      }
    }
    ASSERT_TRUE(w->Commit().ok());
    EXPECT_TRUE(w->tensors().empty());
    EXPECT_EQ(w->Commit().code(), StatusCode::kFailedPrecondition);
  }
  EXPECT_TRUE(Exists(path));
  EXPECT_FALSE(Exists(path + ".partial"));

  Result<MappedSafetensorsFile> f = MappedSafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->header().metadata, metadata);
  EXPECT_EQ(f->header().data_start % 8, 0u);
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(f->file_bytes(), static_cast<uint64_t>(st.st_size));

  // Move the mapping; the moved-to object still reads the bytes.
  MappedSafetensorsFile moved = std::move(f).value();
  std::vector<TensorRef> refs = moved.tensors();
  ASSERT_EQ(refs.size(), specs.size());
  for (size_t i = 0; i < refs.size(); ++i) {
    EXPECT_EQ(refs[i].spec, specs[i]);
    ASSERT_EQ(refs[i].bytes, *specs[i].ByteSize());
    const auto* p = static_cast<const uint8_t*>(refs[i].data);
    for (uint64_t b = 0; b < refs[i].bytes; ++b) {
      ASSERT_EQ(p[b], static_cast<uint8_t>(i * 31 + b)) << i << " " << b;
    }
  }
}

// kKeepMapped: the file is in place at once and the writer's memory stays
// readable (what `tensorhub fetch --hold` serves) until the writer goes; the
// committed file outlives it.
TEST_F(SafetensorsFileTest, CommitKeepingTheMapping) {
  const std::string path = Path("held.safetensors");
  const std::vector<TensorSpec> specs = SampleSpecs();
  {
    Result<SafetensorsFileWriter> w =
        SafetensorsFileWriter::Create(path, specs, {});
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    for (const TensorRef& t : w->tensors()) {
      std::memset(t.data, 0x5a, t.bytes);
    }
    ASSERT_TRUE(w->Commit(AfterCommit::kKeepMapped).ok());
    EXPECT_TRUE(Exists(path));
    EXPECT_FALSE(Exists(path + ".partial"));
    EXPECT_EQ(w->Commit().code(), StatusCode::kFailedPrecondition);
    std::vector<TensorRef> refs = w->tensors();
    ASSERT_EQ(refs.size(), specs.size());
    // The memory is the committed file's: what it reads is in the file.
    Result<MappedSafetensorsFile> f = MappedSafetensorsFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    for (size_t i = 0; i < refs.size(); ++i) {
      ASSERT_EQ(refs[i].bytes, f->tensors()[i].bytes);
      EXPECT_EQ(std::memcmp(refs[i].data, f->tensors()[i].data, refs[i].bytes),
                0)
          << i;
      for (uint64_t b = 0; b < refs[i].bytes; ++b) {
        ASSERT_EQ(static_cast<const uint8_t*>(refs[i].data)[b], 0x5a);
      }
    }
  }
  EXPECT_TRUE(Exists(path));  // destroying the writer keeps the file
  Result<MappedSafetensorsFile> again = MappedSafetensorsFile::Open(path);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
}

TEST_F(SafetensorsFileTest, DestroyWithoutCommitRemovesPartial) {
  const std::string path = Path("aborted.safetensors");
  {
    Result<SafetensorsFileWriter> w =
        SafetensorsFileWriter::Create(path, SampleSpecs(), {});
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    // Moving keeps one owner: the partial file survives the moved-from
    // object and goes with the moved-to one.
    SafetensorsFileWriter owner = std::move(w).value();
    EXPECT_TRUE(Exists(path + ".partial"));
  }
  EXPECT_FALSE(Exists(path + ".partial"));
  EXPECT_FALSE(Exists(path));
}

TEST_F(SafetensorsFileTest, CreateErrors) {
  Result<SafetensorsFileWriter> bad_spec = SafetensorsFileWriter::Create(
      Path("x.safetensors"), {{"a", DType::kU8, {1}}, {"a", DType::kU8, {1}}},
      {});
  EXPECT_EQ(bad_spec.status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(Exists(dir_ + "/x.safetensors.partial"));

  Result<SafetensorsFileWriter> no_dir = SafetensorsFileWriter::Create(
      dir_ + "/missing/x.safetensors", SampleSpecs(), {});
  EXPECT_EQ(no_dir.status().code(), StatusCode::kNotFound);
}

TEST_F(SafetensorsFileTest, OpenErrors) {
  Result<MappedSafetensorsFile> missing =
      MappedSafetensorsFile::Open(dir_ + "/nope.safetensors");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);

  Result<MappedSafetensorsFile> dir = MappedSafetensorsFile::Open(dir_);
  EXPECT_EQ(dir.status().code(), StatusCode::kInvalidArgument);

  const std::string empty = Path("empty.safetensors");
  { std::ofstream(empty, std::ios::binary); }
  Result<MappedSafetensorsFile> e = MappedSafetensorsFile::Open(empty);
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find(empty), std::string::npos);

  const std::string garbage = Path("garbage.safetensors");
  {
    std::ofstream out(garbage, std::ios::binary);
    const std::string file = MakeFile(R"({"t":{"dtype":"F32"}})", 0);
    out.write(file.data(), static_cast<std::streamsize>(file.size()));
  }
  Result<MappedSafetensorsFile> g = MappedSafetensorsFile::Open(garbage);
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find("missing shape"), std::string::npos)
      << g.status().message();
}

// The HF checkpoint metadata a reader gets names the files it writes into
// its output directory: a name that is not one plain file name is refused
// (the fuzz target found a backslash let through).
TEST(HfCheckpointTest, ANameThatIsNotOnePlainFileNameIsRefused) {
  auto decode_with = [](const std::string& shard, const std::string& file) {
    HfCheckpoint c;
    c.shards.push_back({shard, "{}", 0});
    c.files.push_back({file, "{}"});
    return DecodeHfCheckpoint(EncodeHfCheckpoint(c));
  };
  Result<HfCheckpoint> good = decode_with("model.safetensors", "config.json");
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  for (const std::string name : {"a/b", "a\\b", "..", ".", ""}) {
    EXPECT_EQ(decode_with(name, "config.json").status().code(),
              StatusCode::kInvalidArgument)
        << name;
    EXPECT_EQ(decode_with("model.safetensors", name).status().code(),
              StatusCode::kInvalidArgument)
        << name;
  }
}

}  // namespace
}  // namespace tensorhub
