// `tensorhub publish FILE.safetensors|DIR` and `tensorhub fetch ... -o
// FILE|DIR`. A directory is a Hugging Face checkpoint (see
// safetensors/hf_checkpoint.h).
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>

#include "cli_util.h"
#include "common/deadline.h"
#include "common/log.h"
#include "safetensors/hf_checkpoint.h"
#include "safetensors/safetensors.h"

namespace tensorhub::cli {
namespace {

// The original header's JSON travels as metadata under this key, so that a
// fetched file is the published file byte for byte.
constexpr char kHeaderKey[] = "safetensors.header";

const std::vector<std::string> kCommonFlags = WithTlsFlags(
    {"hub", "secret-file", "name", "datacenter", "rack", "host-label",
     "data-listen", "advertise-host", "timeout-ms", "metrics-listen"});

std::vector<std::string> With(std::vector<std::string> v,
                              std::initializer_list<const char*> more) {
  for (const char* m : more) v.push_back(m);
  return v;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Bytes 8..data_start of a mapped file: the header JSON, as the file has it.
Result<std::string> HeaderJson(const std::string& path,
                               const MappedSafetensorsFile& file) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  std::string json(file.header().data_start - 8, '\0');
  bool ok = f != nullptr && std::fseek(f, 8, SEEK_SET) == 0 &&
            std::fread(json.data(), 1, json.size(), f) == json.size();
  if (f != nullptr) std::fclose(f);
  if (!ok) return Unavailable("cannot re-read the header of " + path);
  return json;
}

// Maps every shard of checkpoint directory `dir` and fills in their headers.
struct MappedCheckpoint {
  HfCheckpoint ckpt;
  std::vector<MappedSafetensorsFile> files;
  std::vector<TensorRef> tensors;
  uint64_t bytes = 0;
};

Result<MappedCheckpoint> MapCheckpoint(const std::string& dir) {
  MappedCheckpoint m;
  TH_ASSIGN_OR_RETURN(m.ckpt, ScanHfCheckpointDir(dir));
  for (HfShard& shard : m.ckpt.shards) {
    const std::string path = dir + "/" + shard.name;
    TH_ASSIGN_OR_RETURN(MappedSafetensorsFile file,
                        MappedSafetensorsFile::Open(path));
    TH_ASSIGN_OR_RETURN(shard.header_json, HeaderJson(path, file));
    shard.data_bytes = file.file_bytes() - file.header().data_start;
    m.bytes += shard.data_bytes;
    for (const TensorRef& t : file.tensors()) m.tensors.push_back(t);
    m.files.push_back(std::move(file));
  }
  return m;
}

// Writes a fetched checkpoint: a writer per shard, then the small files.
int FetchCheckpoint(Client& client, const ModelRef& ref,
                    const VersionInfo& info, const std::string& metadata,
                    const std::string& dir, FetchOptions fo) {
  auto ckpt = DecodeHfCheckpoint(metadata);
  if (!ckpt.ok()) return Fail(ckpt.status());
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return Fail(Unavailable("mkdir " + dir + ": " + std::strerror(errno)));
  }
  if (!IsDirectory(dir)) {
    return Fail(InvalidArgument(
        dir + " exists and is not a directory; " + ref.model + "@" +
        std::to_string(info.version.value()) + " is a checkpoint directory"));
  }
  std::vector<SafetensorsFileWriter> writers;
  std::vector<TensorRef> refs;
  for (const HfShard& shard : ckpt->shards) {
    std::string raw(8, '\0');
    uint64_t n = shard.header_json.size();
    for (int i = 0; i < 8; ++i)
      raw[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    raw += shard.header_json;
    auto w = SafetensorsFileWriter::CreateFromRawHeader(dir + "/" + shard.name,
                                                        raw, shard.data_bytes);
    if (!w.ok()) return Fail(w.status());
    for (const TensorRef& t : w->tensors()) refs.push_back(t);
    writers.push_back(std::move(*w));
  }
  ProgressBar bar("fetch " + ref.model + "@" +
                  std::to_string(info.version.value()));
  fo.on_progress = [&bar](const FetchProgress& p) {
    bar.Update(p.bytes_done, p.bytes_total);
  };
  auto stats = client.Fetch(ref.model, info.version, refs, fo);
  bar.Finish();
  if (!stats.ok()) return Fail(stats.status());
  for (SafetensorsFileWriter& w : writers) {
    Status c = w.Commit();
    if (!c.ok()) return Fail(c);
  }
  for (const HfFile& f : ckpt->files) {
    Status c = WriteFileAtomically(dir + "/" + f.name, f.content);
    if (!c.ok()) return Fail(c);
  }
  std::printf(
      "fetched %s@%llu -> %s/: %zu shard(s) and %zu file(s), %s in %.2f s "
      "(%.2f GB/s) from %u holder(s), %u chunk retries; %s\n",
      ref.model.c_str(),
      static_cast<unsigned long long>(stats->version.value()), dir.c_str(),
      ckpt->shards.size(), ckpt->files.size(),
      FormatBytes(stats->bytes).c_str(), stats->seconds,
      stats->seconds > 0 ? stats->bytes / stats->seconds / 1e9 : 0.0,
      stats->sources_used, stats->chunk_retries, FormatStages(*stats).c_str());
  return 0;
}

}  // namespace

int CmdPublish(int argc, char** argv) {
  auto args = ParseArgs(argc, argv, 2,
                        With(kCommonFlags, {"model", "version", "rank",
                                            "group-size", "chunk-bytes"}),
                        {"spot", kDataTlsFlag});
  if (!args.ok()) return Fail(args.status());
  if (args->positional.size() != 1 || !args->Has("model") ||
      !args->Has("version")) {
    return Fail(InvalidArgument(
        "usage: tensorhub publish FILE.safetensors|CHECKPOINT_DIR --model M "
        "--version V"));
  }
  auto version = args->GetU64("version", 0);
  auto rank = args->GetU64("rank", 0);
  auto group = args->GetU64("group-size", 1);
  auto chunk = ParseBytes(args->Get("chunk-bytes", "4MiB"));
  for (const Status& s :
       {version.status(), rank.status(), group.status(), chunk.status()}) {
    if (!s.ok()) return Fail(s);
  }
  if (*version == 0) return Fail(InvalidArgument("--version must be >= 1"));
  const std::string path = args->positional[0];
  const bool is_dir = IsDirectory(path);
  Result<MappedSafetensorsFile> file = Status(StatusCode::kInternal, "unset");
  Result<MappedCheckpoint> ckpt = Status(StatusCode::kInternal, "unset");
  if (is_dir) {
    ckpt = MapCheckpoint(path);
    if (!ckpt.ok()) return Fail(ckpt.status());
  } else {
    file = MappedSafetensorsFile::Open(path);
    if (!file.ok()) return Fail(file.status());
  }
  auto options = ClientOptionsFrom(*args);
  if (!options.ok()) return Fail(options.status());
  BlockStopSignals();
  auto client = Client::Connect(*options);
  if (!client.ok()) return Fail(client.status());

  PublishOptions po;
  po.rank = static_cast<uint32_t>(*rank);
  po.group_size = static_cast<uint32_t>(*group);
  po.chunk_bytes = *chunk;
  if (is_dir) {
    po.metadata.push_back({kHfCheckpointKey, EncodeHfCheckpoint(ckpt->ckpt)});
  } else {
    auto json = HeaderJson(path, *file);
    if (!json.ok()) return Fail(json.status());
    po.metadata.push_back({kHeaderKey, *json});
  }
  Status s = (*client)->Publish(args->Get("model"), Version(*version),
                                is_dir ? ckpt->tensors : file->tensors(), po);
  if (!s.ok()) return Fail(s);
  if (is_dir) {
    std::printf(
        "published checkpoint %s as %s@%llu (rank %u of %u): %zu shard(s), %zu "
        "tensors, %s, and %zu small file(s)\n",
        path.c_str(), args->Get("model").c_str(),
        static_cast<unsigned long long>(*version), po.rank, po.group_size,
        ckpt->ckpt.shards.size(), ckpt->tensors.size(),
        FormatBytes(ckpt->bytes).c_str(), ckpt->ckpt.files.size());
  } else {
    std::printf(
        "published %s as %s@%llu (rank %u of %u): %zu tensors, %s\n",
        path.c_str(), args->Get("model").c_str(),
        static_cast<unsigned long long>(*version), po.rank, po.group_size,
        file->header().tensors.size(),
        FormatBytes(file->file_bytes() - file->header().data_start).c_str());
  }
  std::printf("serving from %s; press Ctrl-C to unpublish and exit\n",
              (*client)->data_address().c_str());
  std::fflush(stdout);
  WaitForStopSignal();
  Status u = (*client)->Unpublish(args->Get("model"), Version(*version), 30000);
  if (!u.ok()) return Fail(u);
  std::printf("unpublished; reads drained\n");
  return 0;
}

int CmdFetch(int argc, char** argv) {
  auto args = ParseArgs(
      argc, argv, 2,
      With(kCommonFlags, {"o", "output", "connections", "group", "step"}),
      {"spot", kDataTlsFlag});
  if (!args.ok()) return Fail(args.status());
  std::string out = args->Get("o", args->Get("output"));
  // Accept the conventional "-o FILE" too.
  std::vector<std::string> pos;
  for (size_t i = 0; i < args->positional.size(); ++i) {
    if (args->positional[i] == "-o" && i + 1 < args->positional.size()) {
      out = args->positional[++i];
    } else {
      pos.push_back(args->positional[i]);
    }
  }
  if (pos.size() != 1 || out.empty()) {
    return Fail(
        InvalidArgument("usage: tensorhub fetch MODEL[@VERSION|@latest] -o "
                        "OUT.safetensors|OUT_DIR"));
  }
  auto ref = ParseModelRef(pos[0]);
  if (!ref.ok()) return Fail(ref.status());
  auto timeout = args->GetU64("timeout-ms", 600000);
  auto conns = args->GetU64("connections", 4);
  if (!timeout.ok()) return Fail(timeout.status());
  if (!conns.ok()) return Fail(conns.status());
  if (*conns < 1 || *conns > 64)
    return Fail(InvalidArgument("--connections must be in [1, 64]"));
  auto options = ClientOptionsFrom(*args);
  if (!options.ok()) return Fail(options.status());
  if (options->name.empty()) options->name = "tensorhub-fetch";
  auto client = Client::Connect(*options);
  if (!client.ok()) return Fail(client.status());

  if (args->Has("step") && !args->Has("group")) {
    return Fail(InvalidArgument("--step needs --group"));
  }
  auto step = args->GetU64("step", 0);
  if (!step.ok()) return Fail(step.status());
  // A reader group resolves `latest` to the version its first rank got for
  // this step (pinning it, if this is the first).
  auto info = args->Has("group")
                  ? (*client)->Describe(ref->model, ref->version,
                                        args->Get("group"), *step)
                  : (*client)->Describe(ref->model, ref->version);
  if (!info.ok()) return Fail(info.status());
  if (info->state != VersionState::kCommitted) {
    return Fail(FailedPrecondition(
        ref->model + "@" + std::to_string(info->version.value()) + " is " +
        std::string(VersionStateName(info->state)) + ", not fetchable"));
  }
  std::string header_json;
  std::string checkpoint;
  bool is_checkpoint = false;
  for (const auto& [k, v] : info->metadata) {
    if (k == kHeaderKey) header_json = v;
    if (k == kHfCheckpointKey) checkpoint = v, is_checkpoint = true;
  }
  if (is_checkpoint) {
    FetchOptions fo;
    fo.timeout_ms = static_cast<int64_t>(*timeout);
    fo.connections = static_cast<int>(*conns);
    fo.serve = false;  // the files are committed (unmapped) right after
    return FetchCheckpoint(**client, *ref, *info, checkpoint, out, fo);
  }
  Result<SafetensorsFileWriter> writer = Status(StatusCode::kInternal, "unset");
  if (!header_json.empty()) {
    std::string raw(8, '\0');
    uint64_t n = header_json.size();
    for (int i = 0; i < 8; ++i)
      raw[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    raw += header_json;
    writer =
        SafetensorsFileWriter::CreateFromRawHeader(out, raw, info->total_bytes);
  }
  if (header_json.empty() || !writer.ok()) {
    if (!header_json.empty()) {
      TH_LOG(WARN) << "published header unusable ("
                   << writer.status().ToString() << "); writing a fresh one";
    }
    std::vector<TensorSpec> specs;
    for (const TensorInfo& t : info->tensors) specs.push_back(t.spec);
    writer = SafetensorsFileWriter::Create(out, specs, {});
  }
  if (!writer.ok()) return Fail(writer.status());

  ProgressBar bar("fetch " + ref->model + "@" +
                  std::to_string(info->version.value()));
  FetchOptions fo;
  fo.timeout_ms = static_cast<int64_t>(*timeout);
  fo.connections = static_cast<int>(*conns);
  fo.serve = false;  // the file is committed (unmapped) right after
  fo.on_progress = [&bar](const FetchProgress& p) {
    bar.Update(p.bytes_done, p.bytes_total);
  };
  auto stats =
      (*client)->Fetch(ref->model, info->version, writer->tensors(), fo);
  bar.Finish();
  if (!stats.ok()) return Fail(stats.status());
  Status c = writer->Commit();
  if (!c.ok()) return Fail(c);
  std::printf(
      "fetched %s@%llu -> %s: %s in %.2f s (%.2f GB/s) from %u holder(s), %u "
      "chunk retries; %s\n",
      ref->model.c_str(),
      static_cast<unsigned long long>(stats->version.value()), out.c_str(),
      FormatBytes(stats->bytes).c_str(), stats->seconds,
      stats->seconds > 0 ? stats->bytes / stats->seconds / 1e9 : 0.0,
      stats->sources_used, stats->chunk_retries, FormatStages(*stats).c_str());
  return 0;
}

}  // namespace tensorhub::cli
