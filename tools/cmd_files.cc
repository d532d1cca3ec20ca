// `tensorhub publish FILE.safetensors|DIR` and `tensorhub fetch ... -o
// FILE|DIR`. A directory is a Hugging Face checkpoint (see
// safetensors/hf_checkpoint.h).
#include <sys/stat.h>

#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "cli_util.h"
#include "common/deadline.h"
#include "common/log.h"
#include "fetch_pause.h"
#include "safetensors/hf_checkpoint.h"
#include "safetensors/safetensors.h"

namespace tensorhub::cli {
namespace {

// The original header's JSON travels as metadata under this key, so that a
// fetched file is the published file byte for byte.
constexpr char kHeaderKey[] = "safetensors.header";

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

// What a published file was when it was mapped, to see it change under its
// holder: truncated or rewritten in place, its mapped bytes are no longer
// the published version's (a truncated tail cannot even be read: every read
// of it fails), so the holder withdraws the version (docs/security.md, "A
// file that changes under its holder").
struct FileStamp {
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = 0;
  timespec mtime{};
};

Result<FileStamp> StampOf(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return Unavailable(path + ": " + std::strerror(errno));
  }
  return FileStamp{st.st_dev, st.st_ino, st.st_size, st.st_mtim};
}

class FileWatch {
 public:
  Status Add(const std::string& path) {
    TH_ASSIGN_OR_RETURN(FileStamp s, StampOf(path));
    files_.emplace_back(path, s);
    return Status::Ok();
  }
  // How a file changed under the mapping ("" if none did). A file
  // replaced at its path (renamed over, deleted) is not a change of what
  // is served: the mapping keeps the old file's bytes.
  std::string Changed() {
    for (auto& [path, was] : files_) {
      Result<FileStamp> now = StampOf(path);
      if (!now.ok() || now->dev != was.dev || now->ino != was.ino) {
        if (!replaced_said_) {
          replaced_said_ = true;
          TH_LOG(INFO) << path
                       << " was replaced or removed; this holder keeps "
                          "serving the bytes it mapped (the published file)";
        }
        continue;
      }
      if (now->size < was.size) {
        return path + " was truncated under this holder (from " +
               std::to_string(was.size) + " to " + std::to_string(now->size) +
               " bytes)";
      }
      if (now->size != was.size || now->mtime.tv_sec != was.mtime.tv_sec ||
          now->mtime.tv_nsec != was.mtime.tv_nsec) {
        return path +
               " was rewritten under this holder (its size or modification "
               "time changed)";
      }
    }
    return "";
  }

 private:
  std::vector<std::pair<std::string, FileStamp>> files_;
  bool replaced_said_ = false;
};

// How often a publisher looks at its files.
constexpr int64_t kFileWatchMs = 500;
// Its exit status when it withdrew a version whose file changed.
constexpr int kExitFileChanged = 3;

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

// ---- publish ----

struct PublishFlags {
  WorkerFlags worker;
  std::string path;
  std::string model;
  uint64_t version = 0;
  uint32_t rank = 0;
  uint32_t group_size = 1;
  uint64_t chunk_bytes = 0;
  std::string chunk_checksum;
  uint64_t timeout_ms = 10000;
};

int RunPublish(const PublishFlags& f) {
  const bool is_dir = IsDirectory(f.path);
  Result<MappedSafetensorsFile> file = Status(StatusCode::kInternal, "unset");
  Result<MappedCheckpoint> ckpt = Status(StatusCode::kInternal, "unset");
  if (is_dir) {
    ckpt = MapCheckpoint(f.path);
    if (!ckpt.ok()) return Fail(ckpt.status());
  } else {
    file = MappedSafetensorsFile::Open(f.path);
    if (!file.ok()) return Fail(file.status());
  }
  auto options = ClientOptionsFrom(f.worker);
  if (!options.ok()) return Fail(options.status());
  options->connect_timeout_ms = static_cast<int64_t>(f.timeout_ms);
  BlockStopSignals();
  auto client = Client::Connect(*options);
  if (!client.ok()) return Fail(client.status());

  PublishOptions po;
  po.rank = f.rank;
  po.group_size = f.group_size;
  po.chunk_bytes = f.chunk_bytes;
  po.chunk_checksum = f.chunk_checksum;
  if (is_dir) {
    po.metadata.push_back({kHfCheckpointKey, EncodeHfCheckpoint(ckpt->ckpt)});
  } else {
    auto json = HeaderJson(f.path, *file);
    if (!json.ok()) return Fail(json.status());
    po.metadata.push_back({kHeaderKey, *json});
  }
  Status s = (*client)->Publish(f.model, Version(f.version),
                                is_dir ? ckpt->tensors : file->tensors(), po);
  if (!s.ok()) return Fail(s);
  if (is_dir) {
    std::printf(
        "published checkpoint %s as %s@%llu (rank %u of %u): %zu shard(s), %zu "
        "tensors, %s, and %zu small file(s)\n",
        f.path.c_str(), f.model.c_str(),
        static_cast<unsigned long long>(f.version), po.rank, po.group_size,
        ckpt->ckpt.shards.size(), ckpt->tensors.size(),
        FormatBytes(ckpt->bytes).c_str(), ckpt->ckpt.files.size());
  } else {
    std::printf(
        "published %s as %s@%llu (rank %u of %u): %zu tensors, %s\n",
        f.path.c_str(), f.model.c_str(),
        static_cast<unsigned long long>(f.version), po.rank, po.group_size,
        file->header().tensors.size(),
        FormatBytes(file->file_bytes() - file->header().data_start).c_str());
  }
  FileWatch watch;
  if (is_dir) {
    for (const HfShard& shard : ckpt->ckpt.shards) {
      if (Status w = watch.Add(f.path + "/" + shard.name); !w.ok()) {
        return Fail(w);
      }
    }
  } else if (Status w = watch.Add(f.path); !w.ok()) {
    return Fail(w);
  }
  std::printf("serving from %s; press Ctrl-C to unpublish and exit\n",
              (*client)->data_address().c_str());
  std::fflush(stdout);
  std::string changed;
  while (WaitForStopSignalFor(kFileWatchMs) == 0) {
    changed = watch.Changed();
    if (!changed.empty()) break;
  }
  if (!changed.empty()) {
    TH_LOG(ERROR) << changed << ": withdrawing " << f.model << "@" << f.version
                  << " at the hub, since what this holder serves is no "
                     "longer the published version (readers go to other "
                     "holders; republish the file as a new version)";
    // Forced: these bytes must not stay the last copy of anything.
    Status u = (*client)->Unpublish(f.model, Version(f.version), 10000,
                                    /*force=*/true);
    if (!u.ok()) {
      TH_LOG(ERROR) << "withdrawing " << f.model << "@" << f.version
                    << " failed: " << u.ToString()
                    << " (the hub drops it when this holder's lease ends)";
    }
    std::fprintf(stderr, "tensorhub: %s; %s@%llu withdrawn\n", changed.c_str(),
                 f.model.c_str(), static_cast<unsigned long long>(f.version));
    return kExitFileChanged;
  }
  Status u = (*client)->Unpublish(f.model, Version(f.version), 30000);
  if (!u.ok()) return Fail(u);
  std::printf("unpublished; reads drained\n");
  return 0;
}

// ---- fetch ----

struct FetchFlags {
  WorkerFlags worker;
  std::string ref;
  std::string out;
  std::optional<uint64_t> timeout_ms;
  int connections = 4;
  std::string group;
  uint64_t step = 0;
  bool hold = false;
  std::string stats_json;
  uint64_t pause_after_chunks = 0;  // hidden: tests (FetchPause)
};

constexpr uint64_t kFetchTimeoutMs = 600000;
// Unpublishing the fetched copy: reads in flight from it finish (drain), and
// if it is the last reliable copy of a retained version, a keeper copies it
// first.
constexpr int64_t kReleaseTimeoutMs = 30000;

// What a fetch writes: one safetensors file, or a checkpoint directory's
// shards (one writer each) and small files.
struct Destination {
  std::vector<SafetensorsFileWriter> writers;
  std::vector<TensorRef> tensors;  // of every writer
  std::vector<HfFile> small_files;
  std::string description;  // for the closing line
};

Result<Destination> FileDestination(const std::string& out,
                                    const VersionInfo& info,
                                    const std::string& header_json) {
  Result<SafetensorsFileWriter> writer = Status(StatusCode::kInternal, "unset");
  if (!header_json.empty()) {
    std::string raw(8, '\0');
    uint64_t n = header_json.size();
    for (int i = 0; i < 8; ++i)
      raw[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    raw += header_json;
    writer =
        SafetensorsFileWriter::CreateFromRawHeader(out, raw, info.total_bytes);
    if (!writer.ok()) {
      TH_LOG(WARN) << "published header unusable ("
                   << writer.status().ToString() << "); writing a fresh one";
    }
  }
  if (header_json.empty() || !writer.ok()) {
    std::vector<TensorSpec> specs;
    for (const TensorInfo& t : info.tensors) specs.push_back(t.spec);
    writer = SafetensorsFileWriter::Create(out, specs, {});
  }
  if (!writer.ok()) return writer.status();
  Destination d;
  d.tensors = writer->tensors();
  d.writers.push_back(std::move(writer).value());
  d.description = out + ":";
  return d;
}

Result<Destination> CheckpointDestination(const std::string& dir,
                                          const ModelRef& ref,
                                          const VersionInfo& info,
                                          const std::string& metadata) {
  TH_ASSIGN_OR_RETURN(HfCheckpoint ckpt, DecodeHfCheckpoint(metadata));
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return Unavailable("mkdir " + dir + ": " + std::strerror(errno));
  }
  if (!IsDirectory(dir)) {
    return InvalidArgument(
        dir + " exists and is not a directory; " + ref.model + "@" +
        std::to_string(info.version.value()) + " is a checkpoint directory");
  }
  Destination d;
  for (const HfShard& shard : ckpt.shards) {
    std::string raw(8, '\0');
    uint64_t n = shard.header_json.size();
    for (int i = 0; i < 8; ++i)
      raw[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    raw += shard.header_json;
    TH_ASSIGN_OR_RETURN(SafetensorsFileWriter w,
                        SafetensorsFileWriter::CreateFromRawHeader(
                            dir + "/" + shard.name, raw, shard.data_bytes));
    for (const TensorRef& t : w.tensors()) d.tensors.push_back(t);
    d.writers.push_back(std::move(w));
  }
  d.description = dir + "/: " + std::to_string(ckpt.shards.size()) +
                  " shard(s) and " + std::to_string(ckpt.files.size()) +
                  " file(s),";
  d.small_files = std::move(ckpt.files);
  return d;
}

// --stats-json: the fetch's figures and where its bytes came from, written
// atomically once the fetch is done (a --hold reader then keeps running).
Status WriteStatsJson(const std::string& path, const std::string& model,
                      const FetchStats& st, const Client& client) {
  nlohmann::ordered_json j = {{"model", model},
                              {"version", st.version.value()},
                              {"worker", client.id().value()},
                              {"data_address", client.data_address()},
                              {"bytes", st.bytes},
                              {"seconds", st.seconds},
                              {"resolve_seconds", st.resolve_seconds},
                              {"schedule_seconds", st.schedule_seconds},
                              {"first_byte_seconds", st.first_byte_seconds},
                              {"transfer_seconds", st.transfer_seconds},
                              {"verify_seconds", st.verify_seconds},
                              {"register_seconds", st.register_seconds},
                              {"total_seconds", st.total_seconds},
                              {"manifest_source", st.manifest_source},
                              {"chunk_retries", st.chunk_retries},
                              {"chunks_stolen", st.chunks_stolen},
                              {"delta_base", st.delta_base.value()},
                              {"bytes_from_delta", st.bytes_from_delta},
                              {"delta_wire_bytes", st.delta_wire_bytes},
                              {"sources", nlohmann::ordered_json::array()}};
  for (const FetchSourceStats& s : st.sources) {
    j["sources"].push_back({{"worker", s.worker.value()},
                            {"address", s.address},
                            {"bytes", s.bytes},
                            {"chunks", s.chunks},
                            {"was_filling", s.was_filling},
                            {"delta_bytes", s.delta_bytes}});
  }
  // Names and addresses are not always UTF-8: replace what is not.
  return WriteFileAtomically(
             path, j.dump(-1, ' ', false,
                          nlohmann::ordered_json::error_handler_t::replace) +
                       "\n")
      .WithContext("--stats-json");
}

// SIGINT/SIGTERM for `fetch --hold`. Until the fetch is done they end the
// process as they would without --hold (exit 128 + N); from then on they
// end the hold, and the fetched copy is released cleanly.
class StopSignals {
 public:
  // Call before any thread starts (they inherit the blocked signals).
  void Start() {
    BlockStopSignals();
    std::thread([this] {
      const int sig = WaitForStopSignal();
      std::unique_lock<std::mutex> lock(mu_);
      if (!armed_) {
        std::fprintf(stderr, "tensorhub: signal %d during the fetch\n", sig);
        std::_Exit(128 + sig);
      }
      signal_ = sig;
      cv_.notify_all();
    }).detach();
  }
  // From now on a signal ends Wait() instead of the process.
  void Arm() {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = true;
  }
  int Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return signal_ != 0; });
    return signal_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false;
  int signal_ = 0;
};

// A fetched copy this worker serves (FetchOptions::serve). Release()
// unpublishes it, which waits for the reads in flight from it; a retained
// version's last reliable copy first waits for a keeper to copy it, and is
// dropped anyway after that. The memory may be unmapped only once it is
// released: a copy that cannot be released ends the process where it stands
// (exit 1), so that no read runs on unmapped memory. Released at the latest
// when destroyed.
class FetchedCopy {
 public:
  FetchedCopy(Client& client, std::string model, Version version)
      : client_(client), model_(std::move(model)), version_(version) {}
  FetchedCopy(const FetchedCopy&) = delete;
  FetchedCopy& operator=(const FetchedCopy&) = delete;
  ~FetchedCopy() { Release(); }

  void Release() {
    if (released_) return;
    released_ = true;
    const std::string name = model_ + "@" + std::to_string(version_.value());
    Status u = client_.Unpublish(model_, version_, kReleaseTimeoutMs);
    if (u.code() == StatusCode::kFailedPrecondition) {
      TH_LOG(WARN) << "releasing " << name << ": " << u.ToString()
                   << "; dropping this copy anyway";
      u = client_.Unpublish(model_, version_, kReleaseTimeoutMs,
                            /*force=*/true);
    }
    if (!u.ok()) {
      Fail(u.WithContext("releasing " + name));
      std::fflush(stdout);
      std::_Exit(1);
    }
  }

 private:
  Client& client_;
  const std::string model_;
  const Version version_;
  bool released_ = false;
};

int RunFetch(const FetchFlags& f) {
  auto ref = ParseModelRef(f.ref);
  if (!ref.ok()) return Fail(ref.status());
  auto options = ClientOptionsFrom(f.worker);
  if (!options.ok()) return Fail(options.status());
  if (options->name.empty()) options->name = "tensorhub-fetch";
  if (f.timeout_ms.has_value()) {
    options->connect_timeout_ms = static_cast<int64_t>(*f.timeout_ms);
  }
  // Never destroyed: its thread may outlive main's locals.
  static StopSignals* const stop = new StopSignals;
  if (f.hold) stop->Start();
  auto client = Client::Connect(*options);
  if (!client.ok()) return Fail(client.status());

  // A reader group resolves `latest` to the version its first rank got for
  // this step (pinning it, if this is the first).
  auto info = !f.group.empty() ? (*client)->Describe(ref->model, ref->version,
                                                     f.group, f.step)
                               : (*client)->Describe(ref->model, ref->version);
  if (!info.ok()) return Fail(info.status());
  if (info->state != VersionState::kCommitted) {
    return Fail(FailedPrecondition(
        ref->model + "@" + std::to_string(info->version.value()) + " is " +
        std::string(VersionStateName(info->state)) + ", not fetchable"));
  }
  const Version version = info->version;
  const std::string vname = ref->model + "@" + std::to_string(version.value());
  std::string header_json;
  std::optional<std::string> checkpoint;
  for (const auto& [k, v] : info->metadata) {
    if (k == kHeaderKey) header_json = v;
    if (k == kHfCheckpointKey) checkpoint = v;
  }
  auto dest = checkpoint.has_value()
                  ? CheckpointDestination(f.out, *ref, *info, *checkpoint)
                  : FileDestination(f.out, *info, header_json);
  if (!dest.ok()) return Fail(dest.status());

  ProgressBar bar("fetch " + vname);
  FetchOptions fo;
  fo.timeout_ms = static_cast<int64_t>(f.timeout_ms.value_or(kFetchTimeoutMs));
  fo.connections = f.connections;
  // A full reader: each chunk is served onward as soon as it is verified,
  // so readers started together form a pipeline, and the whole copy while
  // the command holds it (below).
  fo.serve = true;
  fo.on_progress = [&bar](const FetchProgress& p) {
    bar.Update(p.bytes_done, p.bytes_total);
  };
  // A test's known point mid-fetch (tests/testbed/top_smoke.sh): after that
  // many chunks, say so on stderr and pull nothing more until a line (or
  // EOF) on stdin.
  std::unique_ptr<FetchPause> pause = FetchPause::OnStdio(f.pause_after_chunks);
  auto stats = (*client)->Fetch(ref->model, version, dest->tensors, fo);
  pause.reset();
  bar.Finish();
  if (!stats.ok()) return Fail(stats.status());
  stop->Arm();
  // Declared after `dest`: released before the files are unmapped.
  FetchedCopy copy(**client, ref->model, version);

  // In place at once; the mapping stays, and serves, until released.
  for (SafetensorsFileWriter& w : dest->writers) {
    Status c = w.Commit(AfterCommit::kKeepMapped);
    if (!c.ok()) return Fail(c);
  }
  for (const HfFile& file : dest->small_files) {
    Status c = WriteFileAtomically(f.out + "/" + file.name, file.content);
    if (!c.ok()) return Fail(c);
  }
  std::printf(
      "fetched %s -> %s %s in %.2f s (%s) from %u holder(s), %u chunk "
      "retries; %s\n",
      vname.c_str(), dest->description.c_str(),
      FormatBytes(stats->bytes).c_str(), stats->seconds,
      FormatRate(stats->bytes, stats->seconds).c_str(), stats->sources_used,
      stats->chunk_retries, FormatStages(*stats).c_str());
  if (!f.stats_json.empty()) {
    Status w = WriteStatsJson(f.stats_json, ref->model, *stats, **client);
    if (!w.ok()) return Fail(w);
  }
  if (f.hold) {
    std::printf(
        "holding %s as worker %s, serving from %s; Ctrl-C (or SIGTERM) to "
        "release it and exit\n",
        vname.c_str(), (*client)->id().value().c_str(),
        (*client)->data_address().c_str());
    std::fflush(stdout);
    const int sig = stop->Wait();
    TH_LOG(INFO) << "signal " << sig << ": releasing " << vname;
  }
  std::fflush(stdout);
  copy.Release();
  if (f.hold) std::printf("released %s; reads drained\n", vname.c_str());
  return 0;
}

}  // namespace

void AddFileCommands(CommandLine& cl) {
  auto p = std::make_shared<PublishFlags>();
  CLI::App* c = cl.Add(
      "publish",
      "publish a .safetensors file or an HF checkpoint directory, serve it "
      "until interrupted (a file truncated or rewritten meanwhile: the "
      "version is withdrawn and the command exits with status 3)",
      [p] { return RunPublish(*p); });
  c->add_option("path", p->path,
                "FILE.safetensors, or a directory with *.safetensors shards "
                "(and model.safetensors.index.json, config.json, ...)")
      ->type_name("PATH")
      ->required();
  c->add_option("--model", p->model, "the model's name")->required();
  c->add_option("--version", p->version,
                "the version number (increasing per model)")
      ->check(CLI::PositiveNumber)
      ->required();
  c->add_option("--rank", p->rank,
                "this part's rank in a group publish (a sharded trainer)")
      ->capture_default_str();
  c->add_option("--group-size", p->group_size,
                "ranks in the group: the version is readable once all "
                "published")
      ->check(CLI::Range(1u, 65536u))
      ->capture_default_str();
  AddBytesOption(c, "--chunk-bytes", &p->chunk_bytes, "4MiB",
                 "the unit of transfer and verification");
  c->add_option("--chunk-checksum", p->chunk_checksum,
                "the chunk checksum to publish: xxh3-64-tree-64k (default; "
                "TENSORHUB_CHUNK_CHECKSUM if set), or xxh3-64 while readers "
                "of builds before 2026-11-25 remain")
      ->check(CLI::IsMember({"xxh3-64-tree-64k", "xxh3-64"}));
  c->add_option("--timeout-ms", p->timeout_ms, "deadline for reaching the hub")
      ->check(CLI::Range(uint64_t{1}, uint64_t{3600000}))
      ->capture_default_str();
  AddWorkerFlags(c, &p->worker);

  auto f = std::make_shared<FetchFlags>();
  c = cl.Add("fetch",
             "fetch a version into a file or checkpoint directory, serving "
             "it meanwhile (--hold: after, too)",
             [f] { return RunFetch(*f); });
  c->add_option("version", f->ref, "the version (default: latest)")
      ->type_name("MODEL[@VERSION|@latest]")
      ->required();
  c->add_option("-o,--output", f->out,
                "OUT.safetensors, or a directory for a checkpoint version")
      ->type_name("PATH")
      ->required();
  c->add_flag("--hold", f->hold,
              "after the fetch, keep serving the version to other readers "
              "until SIGINT/SIGTERM, then release it (reads drain)");
  c->add_option("--stats-json", f->stats_json,
                "when the fetch is done, write its figures and the bytes each "
                "holder sent to FILE (JSON)")
      ->type_name("FILE");
  c->add_option("--connections", f->connections,
                "parallel data streams (each may go to another holder)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  CLI::Option* group =
      c->add_option("--group", f->group,
                    "reader group id: every rank of one inference instance "
                    "gets the same `latest` for a --step");
  c->add_option("--step", f->step, "the group's update step (needs --group)")
      ->needs(group);
  c->add_option("--timeout-ms", f->timeout_ms,
                "deadline of the fetch (default 600000), and for reaching the "
                "hub (default 10000)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{86400000}));
  // Hidden: a known point mid-fetch for tests (see RunFetch).
  c->add_option("--pause-after-chunks", f->pause_after_chunks,
                "tests: pause after N verified chunks until a line on stdin")
      ->group("");
  AddWorkerFlags(c, &f->worker);
}

}  // namespace tensorhub::cli
