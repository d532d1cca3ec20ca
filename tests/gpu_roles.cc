#include "gpu_roles.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>
#include <string>

#include "cli_util.h"
#include "client/registry.h"
#include "common/checksum.h"
#include "common/manifest.h"
#include "tensorhub/client.h"
#include "transport/tcp/tcp_transport.h"

namespace tensorhub::testing {

wire::ReadRequest ServedRead(uint64_t epoch, uint64_t offset, uint64_t length) {
  wire::ReadRequest r;
  r.model = "m";
  r.version = 1;
  r.epoch = epoch;
  r.part = 0;
  r.offset = offset;
  r.length = length;
  return r;
}

Result<ServeReady> ParseServeReady(const std::string& line) {
  const size_t sp = line.find(' ', 6);
  char* end = nullptr;
  if (line.rfind("ready ", 0) == 0 && sp != std::string::npos && sp > 6) {
    const uint64_t epoch = std::strtoull(line.c_str() + sp + 1, &end, 10);
    if (end != line.c_str() + sp + 1 && *end == '\0') {
      return ServeReady{line.substr(6, sp - 6), epoch};
    }
  }
  return Internal("the holder did not say 'ready ADDRESS EPOCH': '" + line +
                  "'");
}

std::vector<uint8_t> Pattern(size_t bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(bytes);
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t x = rng();
    std::memcpy(v.data() + i, &x, 8);
  }
  for (; i < bytes; ++i) v[i] = static_cast<uint8_t>(rng());
  return v;
}

std::vector<TensorSpec> GpuLayout(uint64_t bytes) {
  return {TensorSpec{"w.big", DType::kU8, {bytes}},
          TensorSpec{"w.norm", DType::kBF16, {50}},
          TensorSpec{"w.odd", DType::kU8, {1001}}};
}

Result<Tensors> Tensors::Make(const std::vector<TensorSpec>& specs,
                              MemoryLocation memory,
                              const std::vector<uint8_t>& content,
                              std::optional<uint64_t> pool_slack) {
  Tensors t;
  uint64_t off = 0;
  std::unique_ptr<cuda::Stream> stream;
  if (!memory.is_host()) {
    TH_ASSIGN_OR_RETURN(stream, cuda::Stream::Create(memory.device));
  }
  constexpr uint64_t kPoolAlign = 512;  // the caching allocator's rounding
  auto aligned = [](uint64_t n) {
    return (n + kPoolAlign - 1) / kPoolAlign * kPoolAlign;
  };
  uint8_t* pool = nullptr;
  uint64_t pool_at = 0;
  if (pool_slack.has_value() && !memory.is_host()) {
    uint64_t need = *pool_slack;
    for (const TensorSpec& spec : specs) {
      TH_ASSIGN_OR_RETURN(uint64_t n, spec.ByteSize());
      need += aligned(n);
    }
    TH_ASSIGN_OR_RETURN(auto buf,
                        cuda::DeviceBuffer::Allocate(memory.device, need));
    pool = buf->data();
    t.device_.push_back(std::move(buf));
  }
  for (const TensorSpec& spec : specs) {
    TH_ASSIGN_OR_RETURN(uint64_t n, spec.ByteSize());
    if (off + n > content.size()) return InvalidArgument("content too short");
    TensorRef r;
    r.spec = spec;
    r.bytes = n;
    r.memory = memory;
    if (memory.is_host()) {
      t.host_.emplace_back(content.begin() + off, content.begin() + off + n);
      r.data = t.host_.back().data();
    } else if (pool != nullptr) {
      r.data = pool + pool_at;
      pool_at += aligned(n);
      TH_RETURN_IF_ERROR(stream->CopyAsync(r.data, content.data() + off, n));
    } else {
      TH_ASSIGN_OR_RETURN(auto buf,
                          cuda::DeviceBuffer::Allocate(memory.device, n));
      TH_RETURN_IF_ERROR(
          stream->CopyAsync(buf->data(), content.data() + off, n));
      r.data = buf->data();
      t.device_.push_back(std::move(buf));
    }
    off += n;
    t.refs_.push_back(std::move(r));
  }
  if (stream) TH_RETURN_IF_ERROR(stream->Synchronize());
  return t;
}

Result<std::vector<uint8_t>> Tensors::Read() const {
  std::vector<uint8_t> out;
  std::unique_ptr<cuda::Stream> stream;
  for (const TensorRef& r : refs_) {
    size_t at = out.size();
    out.resize(at + r.bytes);
    if (r.memory.is_host()) {
      std::memcpy(out.data() + at, r.data, r.bytes);
      continue;
    }
    if (!stream) {
      TH_ASSIGN_OR_RETURN(stream, cuda::Stream::Create(r.memory.device));
    }
    TH_RETURN_IF_ERROR(stream->CopyAsync(out.data() + at, r.data, r.bytes));
    TH_RETURN_IF_ERROR(stream->Synchronize());
  }
  return out;
}

namespace {

Result<MemoryLocation> ParseMemory(const std::string& s) {
  if (s == "host") return MemoryLocation::Host();
  if (s.rfind("cuda", 0) == 0) {
    int d = s.size() > 5 ? std::stoi(s.substr(5)) : 0;
    return MemoryLocation::Cuda(d);
  }
  return InvalidArgument("memory '" + s + "' is not host or cuda[:N]");
}

bool NextLine(std::string* line) {
  return static_cast<bool>(std::getline(std::cin, *line));
}

void Say(const std::string& s) {
  std::printf("%s\n", s.c_str());
  std::fflush(stdout);
}

// The bare holder: a Registry behind the TCP transport.
// The roles' flags.
struct GpuRoleFlags {
  std::string role;
  std::string hub;
  std::string memory = "cuda";
  uint64_t bytes = 64 << 20;
  uint64_t tensors = 1;
  std::vector<uint64_t> sizes;
  uint64_t version = 1;
  std::string cuda_ipc = "staged";
  int64_t pool_slack = -1;  // -1: each tensor its own allocation
  std::optional<uint64_t> Pool() const {
    if (pool_slack < 0) return std::nullopt;
    return static_cast<uint64_t>(pool_slack);
  }
};

int RunServe(const GpuRoleFlags& f) {
  auto memory = ParseMemory(f.memory);
  if (!memory.ok()) return cli::Fail(memory.status());
  std::vector<TensorSpec> specs;
  uint64_t total = 0;
  if (!f.sizes.empty()) {
    for (size_t i = 0; i < f.sizes.size(); ++i) {
      specs.push_back({"t" + std::to_string(i), DType::kU8, {f.sizes[i]}});
      total += f.sizes[i];
    }
  } else {
    const uint64_t count = f.tensors;
    for (uint64_t i = 0; i < count; ++i) {
      specs.push_back({"t" + std::to_string(i), DType::kU8, {f.bytes / count}});
    }
    specs.push_back({"odd", DType::kU8, {1001}});
    total = (f.bytes / count) * count + 1001;
  }
  auto tensors = Tensors::Make(specs, *memory, Pattern(total, 7), f.Pool());
  if (!tensors.ok()) return cli::Fail(tensors.status());
  std::unique_ptr<cuda::Stream> stream;
  if (!memory->is_host()) {
    auto s = cuda::Stream::Create(memory->device);
    if (!s.ok()) return cli::Fail(s.status());
    stream = std::move(s).value();
  }
  // Device bytes are hashed on the device (the host cannot read them).
  auto part = BuildPartLayout(
      0, tensors->refs(), kDefaultChunkBytes, kDefaultChunkChecksum,
      [&](std::span<const iovec> p) -> Result<uint64_t> {
        if (stream) {
          return stream->Checksum(kDefaultChunkChecksum, p);
        }
        return ChunkSum(kDefaultChunkChecksum, p);
      });
  if (!part.ok()) return cli::Fail(part.status());
  client::Registry registry;
  client::Holding h;
  h.model = "m";
  h.version = Version(1);
  h.chunk_bytes = kDefaultChunkBytes;
  h.rank = 0;
  h.memory = *memory;
  h.parts[0] = *part;
  for (const TensorRef& r : tensors->refs())
    h.bases[0].push_back(static_cast<uint8_t*>(r.data));
  auto epoch = registry.Add(std::move(h));
  if (!epoch.ok()) return cli::Fail(epoch.status());
  Result<transport::TcpTransportOptions> env =
      transport::TcpTransportOptions::FromEnv();
  if (!env.ok()) return cli::Fail(env.status());
  transport::TcpTransportOptions options = *env;
  auto policy = transport::ParseCudaIpcPolicy(f.cuda_ipc);
  if (!policy.ok()) return cli::Fail(policy.status());
  options.cuda_ipc = *policy;
  auto transport = transport::MakeTcpTransport(options);
  auto server = transport->Listen("127.0.0.1:0", &registry, {});
  if (!server.ok()) return cli::Fail(server.status());
  Say("ready " + (*server)->address() + " " + std::to_string(*epoch));
  std::string line;
  while (NextLine(&line)) {
    if (line == "stats") {
      Say("stats " + std::to_string((*server)->bytes_served()) + " " +
          std::to_string((*server)->bytes_served_local()) + " " +
          std::to_string((*server)->bytes_served_staged()));
    } else if (line == "revoke") {
      auto r = registry.Revoke("m", Version(1));
      Say(r.ok() ? "revoked" : "error " + r.status().ToString());
    } else if (line.rfind("drain ", 0) == 0) {
      Status s = registry.Drain("m", Version(1), *epoch,
                                Deadline::AfterMs(std::stoll(line.substr(6))));
      Say(std::string("drained ") + std::string(StatusCodeName(s.code())));
    } else {
      break;
    }
  }
  (*server)->Stop();
  return 0;
}

int RunHolder(const GpuRoleFlags& f) {
  auto memory = ParseMemory(f.memory);
  if (!memory.ok()) return cli::Fail(memory.status());
  const uint64_t bytes = f.bytes;
  const uint64_t version = f.version;
  ClientOptions o;
  o.hub_address = f.hub;
  o.leave_timeout_ms = 0;
  auto client = Client::Connect(o);
  if (!client.ok()) return cli::Fail(client.status());
  std::vector<TensorSpec> specs = GpuLayout(bytes);
  auto tensors =
      Tensors::Make(specs, *memory, Pattern(bytes + 1101, version), f.Pool());
  if (!tensors.ok()) return cli::Fail(tensors.status());
  Status s = (*client)->Publish("m", Version(version), tensors->refs());
  if (!s.ok()) return cli::Fail(s);
  Say("published");
  std::string line;
  while (NextLine(&line)) {
    if (line == "unpublish") {
      Status u = (*client)->Unpublish("m", Version(version), 10000);
      Say(std::string("unpublished ") + std::string(StatusCodeName(u.code())));
    } else {
      break;
    }
  }
  return 0;
}

}  // namespace

int MaybeRunGpuRole(int argc, char** argv) {
  if (argc < 2 || std::strncmp(argv[1], "--role=", 7) != 0) return -1;
  GpuRoleFlags f;
  CLI::App app("a role of the GPU tests (gpu_roles.h)", argv[0]);
  app.add_option("--role", f.role)
      ->check(CLI::IsMember({"serve", "holder"}))
      ->required();
  app.add_option("--hub", f.hub);
  app.add_option("--memory", f.memory);
  app.add_option("--bytes", f.bytes);
  app.add_option("--tensors", f.tensors)->check(CLI::PositiveNumber);
  app.add_option("--sizes", f.sizes)
      ->delimiter(',')
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40));
  app.add_option("--version", f.version);
  app.add_option("--cuda-ipc", f.cuda_ipc);
  app.add_option("--pool-slack", f.pool_slack)->check(CLI::Range(-1, 1 << 30));
  if (std::optional<int> rc = cli::ParseFlags(app, argc, argv)) return *rc;
  if (f.role == "serve") return RunServe(f);
  return RunHolder(f);
}

}  // namespace tensorhub::testing
