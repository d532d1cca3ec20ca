#include "safetensors/hf_checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>

namespace tensorhub {
namespace {

constexpr char kB64[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string Base64Encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v =
        (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += kB64[(v >> s) & 63];
  }
  if (i < in.size()) {
    uint32_t v = uint8_t(in[i]) << 16;
    if (i + 1 < in.size()) v |= uint8_t(in[i + 1]) << 8;
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += i + 1 < in.size() ? kB64[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

Result<std::string> Base64Decode(std::string_view in) {
  if (in.size() % 4 != 0)
    return InvalidArgument("hf checkpoint: base64 length not a multiple of 4");
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    int pad = 0;
    uint32_t v = 0;
    for (int j = 0; j < 4; ++j) {
      char c = in[i + j];
      if (c == '=' && i + 4 == in.size() && j >= 2) {
        ++pad;
        v <<= 6;
        continue;
      }
      int d = val(c);
      if (d < 0 || pad > 0) return InvalidArgument("hf checkpoint: bad base64");
      v = (v << 6) | uint32_t(d);
    }
    out += char((v >> 16) & 0xff);
    if (pad < 2) out += char((v >> 8) & 0xff);
    if (pad < 1) out += char(v & 0xff);
  }
  return out;
}

bool IsUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    uint8_t c = uint8_t(s[i]);
    size_t n;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      n = 1, cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2, cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;
    for (size_t k = 1; k <= n; ++k) {
      uint8_t d = uint8_t(s[i + k]);
      if ((d & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) ||
        (n == 3 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff)) {
      return false;
    }
    i += n + 1;
  }
  return true;
}

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A name the reader writes into its output directory: one plain file name.
// A backslash is refused too: not a separator here, but one on the systems
// a checkpoint directory may be copied to.
Status CheckName(std::string_view name) {
  if (name.empty() || name.size() > 255 || name == "." || name == ".." ||
      name.find_first_of(std::string_view("/\\\t\n\0", 5)) !=
          std::string_view::npos) {
    return InvalidArgument(
        "hf checkpoint: bad file name '" + std::string(name) +
        "' (empty, '.', '..', over 255 bytes, or holding '/', "
        "'\\', a tab, a newline or NUL)");
  }
  return Status();
}

Status ErrnoError(const std::string& what, const std::string& path, int err) {
  std::string msg = what + " " + path + ": " + std::strerror(err);
  if (err == ENOENT) return NotFound(msg);
  return Status(StatusCode::kUnavailable, msg);
}

Result<std::string> ReadSmallFile(const std::string& path, uint64_t limit) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open", path, errno);
  std::string out;
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      ::close(fd);
      return ErrnoError("read", path, e);
    }
    if (n == 0) break;
    out.append(buf, size_t(n));
    if (out.size() > limit) {
      ::close(fd);
      return InvalidArgument(path + " grew past " + std::to_string(limit) +
                             " bytes while read");
    }
  }
  ::close(fd);
  return out;
}

}  // namespace

Result<HfCheckpoint> ScanHfCheckpointDir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ErrnoError("open directory", dir, errno);
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());

  static const char* kOtherWeights[] = {".bin", ".pt",      ".pth",  ".gguf",
                                        ".h5",  ".msgpack", ".ckpt", ".onnx"};
  HfCheckpoint ckpt;
  std::string index;
  uint64_t small_total = 0;
  for (const std::string& n : names) {
    const std::string path = dir + "/" + n;
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return ErrnoError("stat", path, errno);
    if (!S_ISREG(st.st_mode))
      continue;  // subdirectories, sockets: not part of it
    if (n[0] == '.' || EndsWith(n, ".partial")) continue;
    TH_RETURN_IF_ERROR(CheckName(n));
    if (EndsWith(n, ".safetensors")) {
      if (ckpt.shards.size() == kHfMaxShards) {
        return InvalidArgument(dir + ": more than " +
                               std::to_string(kHfMaxShards) + " shards");
      }
      ckpt.shards.push_back({n, "", 0});
      continue;
    }
    for (const char* ext : kOtherWeights) {
      if (EndsWith(n, ext)) {
        return InvalidArgument(
            dir + "/" + n +
            ": weights in a format other than safetensors; "
            "save the checkpoint with safe_serialization=True (or move "
            "the file away) and publish again");
      }
    }
    if (uint64_t(st.st_size) > kHfMaxSmallFileBytes) {
      return InvalidArgument(
          path + " is " + std::to_string(st.st_size) +
          " bytes; files other than shards travel with the version up to " +
          std::to_string(kHfMaxSmallFileBytes >> 20) + " MiB each");
    }
    small_total += uint64_t(st.st_size);
    if (small_total > kHfMaxSmallFilesBytes) {
      return InvalidArgument(
          dir + ": the files other than shards exceed " +
          std::to_string(kHfMaxSmallFilesBytes >> 20) + " MiB in all (at " + n +
          "); move the large ones away and ship them separately");
    }
    TH_ASSIGN_OR_RETURN(std::string content,
                        ReadSmallFile(path, kHfMaxSmallFileBytes));
    if (n == "model.safetensors.index.json") index = content;
    ckpt.files.push_back({n, std::move(content)});
  }
  if (ckpt.shards.empty()) {
    return InvalidArgument(dir +
                           " has no *.safetensors files: not a Hugging Face "
                           "checkpoint (save it with save_pretrained(..., "
                           "safe_serialization=True))");
  }
  if (!index.empty()) {
    for (const HfShard& s : ckpt.shards) {
      if (index.find("\"" + s.name + "\"") == std::string::npos) {
        return InvalidArgument(
            dir + "/" + s.name +
            " is not named in model.safetensors.index.json: a stray shard "
            "(of another save?) would mix two checkpoints");
      }
    }
  }
  return ckpt;
}

std::string EncodeHfCheckpoint(const HfCheckpoint& ckpt) {
  std::string out;
  for (const HfShard& s : ckpt.shards) {
    out += "H\t" + s.name + "\t" + std::to_string(s.header_json.size()) + "\t" +
           std::to_string(s.data_bytes) + "\n" + s.header_json;
  }
  for (const HfFile& f : ckpt.files) {
    if (IsUtf8(f.content)) {
      out += "F\t" + f.name + "\t" + std::to_string(f.content.size()) + "\n" +
             f.content;
    } else {
      std::string b = Base64Encode(f.content);
      out += "B\t" + f.name + "\t" + std::to_string(b.size()) + "\n" + b;
    }
  }
  return out;
}

Result<HfCheckpoint> DecodeHfCheckpoint(const std::string& value) {
  HfCheckpoint ckpt;
  size_t pos = 0;
  auto number = [](std::string_view t, uint64_t* out) {
    if (t.empty() || t.size() > 19) return false;
    uint64_t v = 0;
    for (char c : t) {
      if (c < '0' || c > '9') return false;
      v = v * 10 + uint64_t(c - '0');
    }
    *out = v;
    return true;
  };
  while (pos < value.size()) {
    size_t eol = value.find('\n', pos);
    if (eol == std::string::npos)
      return InvalidArgument("hf checkpoint metadata: truncated record");
    std::string_view line(value.data() + pos, eol - pos);
    std::vector<std::string_view> parts;
    size_t start = 0;
    while (true) {
      size_t tab = line.find('\t', start);
      parts.push_back(line.substr(
          start, tab == std::string_view::npos ? tab : tab - start));
      if (tab == std::string_view::npos) break;
      start = tab + 1;
    }
    uint64_t len = 0, data_bytes = 0;
    bool shard = parts.size() == 4 && parts[0] == "H";
    bool file = parts.size() == 3 && (parts[0] == "F" || parts[0] == "B");
    if ((!shard && !file) || !number(parts[2], &len) ||
        (shard && !number(parts[3], &data_bytes))) {
      return InvalidArgument("hf checkpoint metadata: malformed record header");
    }
    TH_RETURN_IF_ERROR(CheckName(parts[1]));
    pos = eol + 1;
    if (len > value.size() - pos)
      return InvalidArgument("hf checkpoint metadata: record overruns");
    std::string content = value.substr(pos, len);
    pos += len;
    if (shard) {
      if (ckpt.shards.size() == kHfMaxShards)
        return InvalidArgument("hf checkpoint: too many shards");
      ckpt.shards.push_back(
          {std::string(parts[1]), std::move(content), data_bytes});
    } else if (parts[0] == "B") {
      TH_ASSIGN_OR_RETURN(std::string raw, Base64Decode(content));
      ckpt.files.push_back({std::string(parts[1]), std::move(raw)});
    } else {
      ckpt.files.push_back({std::string(parts[1]), std::move(content)});
    }
  }
  std::vector<std::string> all;
  for (const auto& s : ckpt.shards) all.push_back(s.name);
  for (const auto& f : ckpt.files) all.push_back(f.name);
  std::sort(all.begin(), all.end());
  if (std::adjacent_find(all.begin(), all.end()) != all.end()) {
    return InvalidArgument("hf checkpoint metadata: a file name appears twice");
  }
  if (ckpt.shards.empty())
    return InvalidArgument("hf checkpoint metadata: no shards");
  return ckpt;
}

Status WriteFileAtomically(const std::string& path,
                           const std::string& content) {
  const std::string partial = path + ".partial";
  int fd =
      ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("create", partial, errno);
  size_t done = 0;
  while (done < content.size()) {
    ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      ::close(fd);
      ::unlink(partial.c_str());
      return ErrnoError("write", partial, e);
    }
    done += size_t(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int e = errno;
    ::unlink(partial.c_str());
    return ErrnoError("fsync", partial, e);
  }
  if (::rename(partial.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(partial.c_str());
    return ErrnoError("rename", partial, e);
  }
  return Status();
}

}  // namespace tensorhub
