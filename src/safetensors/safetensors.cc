#include "safetensors/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

namespace tensorhub {
namespace {

constexpr size_t kLengthPrefixBytes = 8;
// Names longer than this are cut in error messages: a hostile file may hold
// a 100 MiB name.
constexpr size_t kMaxQuotedBytes = 80;

Status HeaderError(std::string_view what) {
  return InvalidArgument("safetensors header: " + std::string(what));
}

// 'name' for error messages: cut to kMaxQuotedBytes, bytes that are not
// printable ASCII shown as \xNN.
std::string Quote(std::string_view s) {
  std::string out = "'";
  const size_t n = std::min(s.size(), kMaxQuotedBytes);
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[5];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  if (n < s.size()) out += "...";
  out.push_back('\'');
  return out;
}

std::string ShapeString(const std::vector<uint64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  out += "]";
  return out;
}

std::string RangeString(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

// Returns the offset of the first byte that does not start a valid UTF-8
// sequence (overlong forms, surrogates and code points above U+10FFFF are
// invalid), or npos if `s` is valid UTF-8.
size_t FindInvalidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    uint32_t min_cp;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F, min_cp = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F, min_cp = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07, min_cp = 0x10000;
    } else {
      return i;
    }
    if (s.size() - i < len) return i;
    for (size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// A cursor over JSON text with the few primitives the header needs. Every
// read is bounds-checked against the text; nothing here allocates except the
// strings a caller asks for.
class JsonCursor {
 public:
  explicit JsonCursor(std::string_view text) : text_(text) {}

  void SkipWhitespace() {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
      ++pos_;
    }
  }
  bool AtEnd() const { return pos_ >= text_.size(); }

  // The next byte after whitespace; '\0' at the end (a raw NUL is invalid
  // outside strings, so callers reject both alike).
  char Peek() {
    SkipWhitespace();
    return AtEnd() ? '\0' : text_[pos_];
  }

  // Consumes `c` (after whitespace) if it is next.
  bool Consume(char c) {
    if (Peek() != c) return false;
    ++pos_;
    return true;
  }

  Status SyntaxError(std::string_view what) const {
    return HeaderError("invalid JSON at byte " + std::to_string(pos_) + ": " +
                       std::string(what));
  }

  Status Expect(char c) {
    if (Consume(c)) return Status::Ok();
    return SyntaxError(std::string("expected '") + c + "'");
  }

  // Reads a string token, decoding escapes into `out` (may be null to only
  // validate). The text must already be valid UTF-8.
  Status ReadString(std::string* out) {
    if (Peek() != '"') return SyntaxError("expected a string");
    ++pos_;
    if (out != nullptr) out->clear();
    while (true) {
      if (AtEnd()) return SyntaxError("unterminated string");
      const auto c = static_cast<unsigned char>(text_[pos_]);
      if (c == '"') {
        ++pos_;
        return Status::Ok();
      }
      if (c < 0x20) return SyntaxError("control character in string");
      ++pos_;
      if (c != '\\') {
        if (out != nullptr) out->push_back(static_cast<char>(c));
        continue;
      }
      if (AtEnd()) return SyntaxError("unterminated escape");
      const char e = text_[pos_++];
      char decoded;
      switch (e) {
        case '"':
          decoded = '"';
          break;
        case '\\':
          decoded = '\\';
          break;
        case '/':
          decoded = '/';
          break;
        case 'b':
          decoded = '\b';
          break;
        case 'f':
          decoded = '\f';
          break;
        case 'n':
          decoded = '\n';
          break;
        case 'r':
          decoded = '\r';
          break;
        case 't':
          decoded = '\t';
          break;
        case 'u': {
          uint32_t cp = 0;
          TH_RETURN_IF_ERROR(ReadHex4(&cp));
          if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return SyntaxError("unpaired low surrogate in \\u escape");
          }
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (text_.size() - pos_ < 2 || text_[pos_] != '\\' ||
                text_[pos_ + 1] != 'u') {
              return SyntaxError("unpaired high surrogate in \\u escape");
            }
            pos_ += 2;
            uint32_t low = 0;
            TH_RETURN_IF_ERROR(ReadHex4(&low));
            if (low < 0xDC00 || low > 0xDFFF) {
              return SyntaxError("unpaired high surrogate in \\u escape");
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          if (out != nullptr) AppendUtf8(cp, out);
          continue;
        }
        default:
          return SyntaxError("invalid escape in string");
      }
      if (out != nullptr) out->push_back(decoded);
    }
  }

  // Reads a non-negative integer that fits in 64 bits. On a token of any
  // other kind returns HeaderError(what + " (reason)").
  Status ReadUint64(uint64_t* out, std::string_view what) {
    const char c = Peek();
    auto fail = [&](std::string_view reason) {
      return HeaderError(std::string(what) + " (" + std::string(reason) + ")");
    };
    if (c == '-') return fail("found a negative number");
    if (!IsDigit(c)) return fail("found a non-number");
    if (c == '0' && pos_ + 1 < text_.size() && IsDigit(text_[pos_ + 1])) {
      return SyntaxError("number with a leading zero");
    }
    uint64_t v = 0;
    while (pos_ < text_.size() && IsDigit(text_[pos_])) {
      const uint64_t d = static_cast<uint64_t>(text_[pos_] - '0');
      if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) {
        return fail("number exceeds 2^64-1");
      }
      v = v * 10 + d;
      ++pos_;
    }
    if (pos_ < text_.size() &&
        (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E')) {
      return fail("found a non-integer number");
    }
    *out = v;
    return Status::Ok();
  }

  // Validates one JSON value of any kind without keeping it. `depth` is the
  // number of enclosing arrays and objects.
  Status SkipValue(int depth) {
    const char c = Peek();
    if (c == '{' || c == '[') {
      if (depth >= kSafetensorsMaxJsonDepth) {
        return SyntaxError("nesting deeper than " +
                           std::to_string(kSafetensorsMaxJsonDepth));
      }
      ++pos_;
      const char close = c == '{' ? '}' : ']';
      if (Consume(close)) return Status::Ok();
      do {
        if (c == '{') {
          TH_RETURN_IF_ERROR(ReadString(nullptr));
          TH_RETURN_IF_ERROR(Expect(':'));
        }
        TH_RETURN_IF_ERROR(SkipValue(depth + 1));
      } while (Consume(','));
      if (Consume(close)) return Status::Ok();
      return SyntaxError(std::string("expected ',' or '") + close + "'");
    }
    if (c == '"') return ReadString(nullptr);
    if (c == '-' || IsDigit(c)) return SkipNumber();
    if (c == 't') return SkipWord("true");
    if (c == 'f') return SkipWord("false");
    if (c == 'n') return SkipWord("null");
    if (AtEnd()) return SyntaxError("unexpected end of header");
    return SyntaxError("unexpected character");
  }

 private:
  Status ReadHex4(uint32_t* out) {
    if (text_.size() - pos_ < 4) return SyntaxError("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = text_[pos_ + i];
      uint32_t d;
      if (h >= '0' && h <= '9') {
        d = static_cast<uint32_t>(h - '0');
      } else if (h >= 'a' && h <= 'f') {
        d = static_cast<uint32_t>(h - 'a' + 10);
      } else if (h >= 'A' && h <= 'F') {
        d = static_cast<uint32_t>(h - 'A' + 10);
      } else {
        return SyntaxError("bad hex digit in \\u escape");
      }
      v = (v << 4) | d;
    }
    pos_ += 4;
    *out = v;
    return Status::Ok();
  }

  // JSON number grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
  Status SkipNumber() {
    auto digits = [&]() {
      const size_t start = pos_;
      while (pos_ < text_.size() && IsDigit(text_[pos_])) ++pos_;
      return pos_ - start;
    };
    if (text_[pos_] == '-') ++pos_;
    if (pos_ < text_.size() && text_[pos_] == '0') {
      ++pos_;
      if (pos_ < text_.size() && IsDigit(text_[pos_])) {
        return SyntaxError("number with a leading zero");
      }
    } else if (digits() == 0) {
      return SyntaxError("malformed number");
    }
    if (pos_ < text_.size() && text_[pos_] == '.') {
      ++pos_;
      if (digits() == 0) return SyntaxError("malformed number");
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) {
        ++pos_;
      }
      if (digits() == 0) return SyntaxError("malformed number");
    }
    return Status::Ok();
  }

  Status SkipWord(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) {
      return SyntaxError("unexpected character");
    }
    pos_ += word.size();
    return Status::Ok();
  }

  std::string_view text_;
  size_t pos_ = 0;
};

// Reads the header object into `header` (syntax already validated, but every
// read is still checked: this pass enforces the schema).
class HeaderReader {
 public:
  HeaderReader(std::string_view text, SafetensorsHeader* header)
      : cursor_(text), header_(header) {}

  Status Read() {
    if (!cursor_.Consume('{')) return HeaderError("not a JSON object");
    if (cursor_.Consume('}')) return Status::Ok();
    do {
      std::string key;
      TH_RETURN_IF_ERROR(cursor_.ReadString(&key));
      TH_RETURN_IF_ERROR(cursor_.Expect(':'));
      if (key == "__metadata__") {
        if (seen_metadata_) return HeaderError("duplicate key '__metadata__'");
        seen_metadata_ = true;
        TH_RETURN_IF_ERROR(ReadMetadata());
      } else {
        if (!names_.insert(key).second) {
          return HeaderError("duplicate tensor name " + Quote(key));
        }
        SafetensorsEntry entry;
        entry.spec.name = std::move(key);
        TH_RETURN_IF_ERROR(ReadTensor(&entry));
        header_->tensors.push_back(std::move(entry));
      }
    } while (cursor_.Consume(','));
    return cursor_.Expect('}');
  }

 private:
  Status ReadMetadata() {
    if (!cursor_.Consume('{')) {
      return HeaderError("__metadata__ is not an object of strings");
    }
    if (cursor_.Consume('}')) return Status::Ok();
    std::unordered_set<std::string> keys;
    do {
      std::string key;
      TH_RETURN_IF_ERROR(cursor_.ReadString(&key));
      TH_RETURN_IF_ERROR(cursor_.Expect(':'));
      if (cursor_.Peek() != '"') {
        return HeaderError("__metadata__ value for key " + Quote(key) +
                           " is not a string");
      }
      std::string value;
      TH_RETURN_IF_ERROR(cursor_.ReadString(&value));
      if (!keys.insert(key).second) {
        return HeaderError("duplicate __metadata__ key " + Quote(key));
      }
      header_->metadata.emplace_back(std::move(key), std::move(value));
    } while (cursor_.Consume(','));
    return cursor_.Expect('}');
  }

  Status ReadTensor(SafetensorsEntry* entry) {
    const std::string name = Quote(entry->spec.name);
    if (!cursor_.Consume('{')) {
      return HeaderError("tensor " + name +
                         " is not an object with dtype, shape and "
                         "data_offsets");
    }
    bool has_dtype = false;
    bool has_shape = false;
    bool has_offsets = false;
    if (!cursor_.Consume('}')) {
      do {
        std::string key;
        TH_RETURN_IF_ERROR(cursor_.ReadString(&key));
        TH_RETURN_IF_ERROR(cursor_.Expect(':'));
        bool* seen;
        if (key == "dtype") {
          seen = &has_dtype;
        } else if (key == "shape") {
          seen = &has_shape;
        } else if (key == "data_offsets") {
          seen = &has_offsets;
        } else {
          return HeaderError("tensor " + name + ": unexpected key " +
                             Quote(key));
        }
        if (*seen) {
          return HeaderError("tensor " + name + ": duplicate key " +
                             Quote(key));
        }
        *seen = true;
        if (key == "dtype") {
          TH_RETURN_IF_ERROR(ReadDType(name, &entry->spec.dtype));
        } else if (key == "shape") {
          TH_RETURN_IF_ERROR(ReadShape(name, &entry->spec.shape));
        } else {
          TH_RETURN_IF_ERROR(ReadOffsets(name, entry));
        }
      } while (cursor_.Consume(','));
      TH_RETURN_IF_ERROR(cursor_.Expect('}'));
    }
    if (!has_dtype) return HeaderError("tensor " + name + ": missing dtype");
    if (!has_shape) return HeaderError("tensor " + name + ": missing shape");
    if (!has_offsets) {
      return HeaderError("tensor " + name + ": missing data_offsets");
    }
    return Status::Ok();
  }

  Status ReadDType(const std::string& name, DType* dtype) {
    if (cursor_.Peek() != '"') {
      return HeaderError("tensor " + name + ": dtype is not a string");
    }
    std::string s;
    TH_RETURN_IF_ERROR(cursor_.ReadString(&s));
    Result<DType> parsed = ParseDType(s);
    if (!parsed.ok()) {
      return HeaderError("tensor " + name + ": unknown dtype " + Quote(s));
    }
    *dtype = *parsed;
    return Status::Ok();
  }

  Status ReadShape(const std::string& name, std::vector<uint64_t>* shape) {
    const std::string what =
        "tensor " + name + ": shape is not an array of non-negative integers";
    if (!cursor_.Consume('[')) return HeaderError(what);
    if (cursor_.Consume(']')) return Status::Ok();
    do {
      if (shape->size() == kSafetensorsMaxRank) {
        return HeaderError("tensor " + name + ": rank exceeds " +
                           std::to_string(kSafetensorsMaxRank));
      }
      uint64_t d;
      TH_RETURN_IF_ERROR(cursor_.ReadUint64(&d, what));
      shape->push_back(d);
    } while (cursor_.Consume(','));
    return cursor_.Expect(']');
  }

  Status ReadOffsets(const std::string& name, SafetensorsEntry* entry) {
    const std::string what = "tensor " + name +
                             ": data_offsets is not an array of 2 "
                             "non-negative integers";
    if (!cursor_.Consume('[')) return HeaderError(what);
    TH_RETURN_IF_ERROR(cursor_.ReadUint64(&entry->begin, what));
    if (!cursor_.Consume(',')) return HeaderError(what);
    TH_RETURN_IF_ERROR(cursor_.ReadUint64(&entry->end, what));
    if (!cursor_.Consume(']')) return HeaderError(what);
    return Status::Ok();
  }

  JsonCursor cursor_;
  SafetensorsHeader* header_;
  bool seen_metadata_ = false;
  std::unordered_set<std::string> names_;
};

// Checks each tensor against its dtype/shape and the data section, then
// sorts them by offset and checks that they tile [0, data_bytes) exactly.
Status ValidateLayout(uint64_t data_bytes, SafetensorsHeader* header) {
  for (const SafetensorsEntry& e : header->tensors) {
    const std::string name = Quote(e.spec.name);
    if (e.begin > e.end) {
      return HeaderError("tensor " + name + " data_offsets " +
                         RangeString(e.begin, e.end) + " have begin > end");
    }
    if (e.end > data_bytes) {
      return HeaderError("tensor " + name + " data_offsets " +
                         RangeString(e.begin, e.end) +
                         " end beyond the data section (" +
                         std::to_string(data_bytes) + " bytes)");
    }
    Result<uint64_t> bytes = e.spec.ByteSize();
    if (!bytes.ok()) {
      return HeaderError("tensor " + name + " dtype " +
                         std::string(DTypeName(e.spec.dtype)) + " shape " +
                         ShapeString(e.spec.shape) +
                         ": byte size overflows 64 bits");
    }
    if (*bytes != e.end - e.begin) {
      return HeaderError("tensor " + name + " data_offsets " +
                         RangeString(e.begin, e.end) + " do not match dtype " +
                         std::string(DTypeName(e.spec.dtype)) + " shape " +
                         ShapeString(e.spec.shape) + " (" +
                         std::to_string(*bytes) + " bytes)");
    }
  }
  std::stable_sort(header->tensors.begin(), header->tensors.end(),
                   [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
                     if (a.begin != b.begin) return a.begin < b.begin;
                     return a.end < b.end;
                   });
  uint64_t covered = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry& e : header->tensors) {
    if (e.begin < covered) {
      return HeaderError("tensors " + Quote(prev->spec.name) + " " +
                         RangeString(prev->begin, prev->end) + " and " +
                         Quote(e.spec.name) + " " +
                         RangeString(e.begin, e.end) + " overlap");
    }
    if (e.begin > covered) {
      return HeaderError("data bytes " + RangeString(covered, e.begin) +
                         " before tensor " + Quote(e.spec.name) +
                         " belong to no tensor");
    }
    covered = e.end;
    prev = &e;
  }
  if (covered != data_bytes) {
    return HeaderError("data bytes " + RangeString(covered, data_bytes) +
                       " at the end of the file belong to no tensor");
  }
  return Status::Ok();
}

void AppendJsonString(std::string_view s, std::string* out) {
  out->push_back('"');
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(ch);
    } else if (c < 0x20) {
      char buf[7];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      *out += buf;
    } else {
      out->push_back(ch);
    }
  }
  out->push_back('"');
}

Status CheckUtf8(std::string_view what, std::string_view s) {
  if (FindInvalidUtf8(s) == std::string_view::npos) return Status::Ok();
  return InvalidArgument("safetensors: " + std::string(what) + " " + Quote(s) +
                         " is not valid UTF-8");
}

// ---- OS helpers ----

[[maybe_unused]] const char* StrErrorResult(int rc, const char* buf) {
  return rc == 0 ? buf : "unknown error";
}
[[maybe_unused]] const char* StrErrorResult(const char* s, const char*) {
  return s;
}

// Maps an errno from a file operation to a status code.
Status ErrnoStatus(std::string_view op, const std::string& path, int err) {
  char buf[128] = {};
  std::string m = std::string(op) + " " + path + ": " +
                  StrErrorResult(strerror_r(err, buf, sizeof(buf)), buf);
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return NotFound(std::move(m));
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
    case EFBIG:
      return ResourceExhausted(std::move(m));
    case EACCES:
    case EPERM:
    case EROFS:
      return PermissionDenied(std::move(m));
    case EISDIR:
    case ENAMETOOLONG:
      return InvalidArgument(std::move(m));
    default:
      return Unavailable(std::move(m));
  }
}

int OpenRetry(const char* path, int flags, mode_t mode = 0) {
  int fd;
  do {
    fd = ::open(path, flags, mode);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

Result<SafetensorsHeader> ParseSafetensorsHeader(const uint8_t* bytes,
                                                 size_t size,
                                                 uint64_t file_bytes) {
  if (size > file_bytes) {
    return InvalidArgument("safetensors: buffer of " + std::to_string(size) +
                           " bytes is larger than the file (" +
                           std::to_string(file_bytes) + " bytes)");
  }
  if (file_bytes < kLengthPrefixBytes) {
    return InvalidArgument("safetensors: file is " +
                           std::to_string(file_bytes) +
                           " bytes, shorter than the 8-byte header length");
  }
  if (size < kLengthPrefixBytes || bytes == nullptr) {
    return InvalidArgument("safetensors: need the first 8 bytes of the file, " +
                           std::to_string(size) + " given");
  }
  uint64_t n = 0;
  for (size_t i = 0; i < kLengthPrefixBytes; ++i) {
    n |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  }
  if (n > kSafetensorsMaxHeaderBytes) {
    return InvalidArgument("safetensors: header length " + std::to_string(n) +
                           " exceeds the limit of " +
                           std::to_string(kSafetensorsMaxHeaderBytes) +
                           " bytes");
  }
  if (n > file_bytes - kLengthPrefixBytes) {
    return InvalidArgument("safetensors: header length " + std::to_string(n) +
                           " exceeds the " +
                           std::to_string(file_bytes - kLengthPrefixBytes) +
                           " bytes that follow it in the file");
  }
  if (n > size - kLengthPrefixBytes) {
    return InvalidArgument(
        "safetensors: header length " + std::to_string(n) + " but only " +
        std::to_string(size - kLengthPrefixBytes) + " header bytes given");
  }
  const std::string_view text(
      reinterpret_cast<const char*>(bytes + kLengthPrefixBytes),
      static_cast<size_t>(n));
  if (const size_t bad = FindInvalidUtf8(text); bad != std::string_view::npos) {
    return HeaderError("invalid UTF-8 at byte " + std::to_string(bad));
  }
  // Pass 1: plain JSON syntax, so syntax errors are reported as such.
  JsonCursor syntax(text);
  TH_RETURN_IF_ERROR(syntax.SkipValue(0));
  syntax.SkipWhitespace();
  if (!syntax.AtEnd()) {
    return syntax.SyntaxError("trailing characters after the JSON value");
  }
  // Pass 2: the schema.
  SafetensorsHeader header;
  header.data_start = kLengthPrefixBytes + n;
  TH_RETURN_IF_ERROR(HeaderReader(text, &header).Read());
  TH_RETURN_IF_ERROR(ValidateLayout(file_bytes - header.data_start, &header));
  return header;
}

Result<std::string> BuildSafetensorsHeader(
    const std::vector<TensorSpec>& specs,
    const std::vector<std::pair<std::string, std::string>>& metadata) {
  std::string json = "{";
  if (!metadata.empty()) {
    std::unordered_set<std::string_view> keys;
    json += "\"__metadata__\":{";
    for (size_t i = 0; i < metadata.size(); ++i) {
      const auto& [key, value] = metadata[i];
      TH_RETURN_IF_ERROR(CheckUtf8("metadata key", key));
      TH_RETURN_IF_ERROR(CheckUtf8("metadata value", value));
      if (!keys.insert(key).second) {
        return InvalidArgument("safetensors: duplicate metadata key " +
                               Quote(key));
      }
      if (i > 0) json += ",";
      AppendJsonString(key, &json);
      json += ":";
      AppendJsonString(value, &json);
    }
    json += "}";
  }
  std::unordered_set<std::string_view> names;
  uint64_t offset = 0;
  for (const TensorSpec& spec : specs) {
    TH_RETURN_IF_ERROR(CheckUtf8("tensor name", spec.name));
    if (spec.name == "__metadata__") {
      return InvalidArgument(
          "safetensors: tensor name '__metadata__' is reserved");
    }
    if (!names.insert(spec.name).second) {
      return InvalidArgument("safetensors: duplicate tensor name " +
                             Quote(spec.name));
    }
    if (spec.shape.size() > kSafetensorsMaxRank) {
      return InvalidArgument("safetensors: tensor " + Quote(spec.name) +
                             " rank exceeds " +
                             std::to_string(kSafetensorsMaxRank));
    }
    TH_ASSIGN_OR_RETURN(const uint64_t bytes, spec.ByteSize());
    if (bytes > std::numeric_limits<uint64_t>::max() - offset) {
      return InvalidArgument(
          "safetensors: total tensor bytes overflow 64 bits at tensor " +
          Quote(spec.name));
    }
    if (json.size() > 1) json += ",";
    AppendJsonString(spec.name, &json);
    json += ":{\"dtype\":\"";
    json += DTypeName(spec.dtype);
    json += "\",\"shape\":[";
    for (size_t i = 0; i < spec.shape.size(); ++i) {
      if (i > 0) json += ",";
      json += std::to_string(spec.shape[i]);
    }
    json += "],\"data_offsets\":[" + std::to_string(offset) + "," +
            std::to_string(offset + bytes) + "]}";
    offset += bytes;
  }
  json += "}";
  // The reference pads N itself to a multiple of 8; with the 8-byte prefix
  // that also aligns data_start.
  json.append((8 - json.size() % 8) % 8, ' ');
  if (json.size() > kSafetensorsMaxHeaderBytes) {
    return InvalidArgument("safetensors: header of " +
                           std::to_string(json.size()) +
                           " bytes exceeds the limit of " +
                           std::to_string(kSafetensorsMaxHeaderBytes));
  }
  std::string out(kLengthPrefixBytes, '\0');
  const uint64_t n = json.size();
  for (size_t i = 0; i < kLengthPrefixBytes; ++i) {
    out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  }
  out += json;
  return out;
}

// ---- MappedSafetensorsFile ----

Result<MappedSafetensorsFile> MappedSafetensorsFile::Open(
    const std::string& path) {
  const int fd = OpenRetry(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("open", path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus("fstat", path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument(path + ": not a regular file");
  }
  const auto file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < kLengthPrefixBytes ||
      file_bytes > std::numeric_limits<size_t>::max()) {
    ::close(fd);
    // Let the parser word the error for short files.
    Result<SafetensorsHeader> r =
        ParseSafetensorsHeader(nullptr, 0, file_bytes);
    if (!r.ok()) return r.status().WithContext(path);
    return InvalidArgument(path + ": file too large to map");
  }
  void* base = ::mmap(nullptr, static_cast<size_t>(file_bytes), PROT_READ,
                      MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file open
  if (base == MAP_FAILED) return ErrnoStatus("mmap", path, err);

  MappedSafetensorsFile file;
  file.base_ = base;
  file.file_bytes_ = file_bytes;
  Result<SafetensorsHeader> header =
      ParseSafetensorsHeader(static_cast<const uint8_t*>(base),
                             static_cast<size_t>(file_bytes), file_bytes);
  if (!header.ok()) return header.status().WithContext(path);
  file.header_ = std::move(header).value();
  return file;
}

MappedSafetensorsFile::MappedSafetensorsFile(
    MappedSafetensorsFile&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)),
      file_bytes_(std::exchange(other.file_bytes_, 0)),
      header_(std::move(other.header_)) {}

MappedSafetensorsFile& MappedSafetensorsFile::operator=(
    MappedSafetensorsFile&& other) noexcept {
  if (this != &other) {
    Reset();
    base_ = std::exchange(other.base_, nullptr);
    file_bytes_ = std::exchange(other.file_bytes_, 0);
    header_ = std::move(other.header_);
  }
  return *this;
}

MappedSafetensorsFile::~MappedSafetensorsFile() { Reset(); }

void MappedSafetensorsFile::Reset() {
  if (base_ != nullptr) ::munmap(base_, static_cast<size_t>(file_bytes_));
  base_ = nullptr;
  file_bytes_ = 0;
  header_ = SafetensorsHeader();
}

std::vector<TensorRef> MappedSafetensorsFile::tensors() const {
  std::vector<TensorRef> refs;
  if (base_ == nullptr) return refs;
  refs.reserve(header_.tensors.size());
  auto* data = static_cast<uint8_t*>(base_) + header_.data_start;
  for (const SafetensorsEntry& e : header_.tensors) {
    refs.push_back(TensorRef{e.spec, data + e.begin, e.end - e.begin,
                             MemoryLocation::Host()});
  }
  return refs;
}

// ---- SafetensorsFileWriter ----

Result<SafetensorsFileWriter> SafetensorsFileWriter::Create(
    const std::string& path, const std::vector<TensorSpec>& specs,
    const std::vector<std::pair<std::string, std::string>>& metadata) {
  TH_ASSIGN_OR_RETURN(const std::string header,
                      BuildSafetensorsHeader(specs, metadata));
  std::vector<uint64_t> begins;
  uint64_t data_bytes = 0;
  for (const TensorSpec& spec : specs) {
    // Cannot fail or overflow: BuildSafetensorsHeader checked both.
    TH_ASSIGN_OR_RETURN(const uint64_t bytes, spec.ByteSize());
    begins.push_back(data_bytes);
    data_bytes += bytes;
  }
  return CreateWithHeader(path, header, specs, std::move(begins), data_bytes);
}

Result<SafetensorsFileWriter> SafetensorsFileWriter::CreateFromRawHeader(
    const std::string& path, const std::string& raw_header,
    uint64_t data_bytes) {
  if (data_bytes > UINT64_MAX - raw_header.size()) {
    return InvalidArgument("safetensors: " + path + ": file size overflows");
  }
  TH_ASSIGN_OR_RETURN(SafetensorsHeader h,
                      ParseSafetensorsHeader(
                          reinterpret_cast<const uint8_t*>(raw_header.data()),
                          raw_header.size(), raw_header.size() + data_bytes));
  if (h.data_start != raw_header.size()) {
    return InvalidArgument(
        "safetensors: raw header of " + std::to_string(raw_header.size()) +
        " bytes declares a data start of " + std::to_string(h.data_start));
  }
  std::vector<TensorSpec> specs;
  std::vector<uint64_t> begins;
  for (const SafetensorsEntry& e : h.tensors) {
    specs.push_back(e.spec);
    begins.push_back(e.begin);
  }
  return CreateWithHeader(path, raw_header, specs, std::move(begins),
                          data_bytes);
}

Result<SafetensorsFileWriter> SafetensorsFileWriter::CreateWithHeader(
    const std::string& path, const std::string& header,
    const std::vector<TensorSpec>& specs, std::vector<uint64_t> begins,
    uint64_t data_bytes) {
  SafetensorsFileWriter w;
  w.path_ = path;
  w.partial_path_ = path + ".partial";
  w.data_start_ = header.size();
  w.specs_ = specs;
  w.begins_ = std::move(begins);
  constexpr uint64_t kMaxFileBytes = std::min<uint64_t>(
      std::numeric_limits<off_t>::max(), std::numeric_limits<size_t>::max());
  if (data_bytes > kMaxFileBytes - w.data_start_) {
    return InvalidArgument("safetensors: " + path + ": " +
                           std::to_string(data_bytes) +
                           " tensor bytes exceed the largest mappable file");
  }
  w.file_bytes_ = w.data_start_ + data_bytes;

  w.fd_ = OpenRetry(w.partial_path_.c_str(),
                    O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w.fd_ < 0) return ErrnoStatus("create", w.partial_path_, errno);
  // Reserve the blocks now so a full disk fails here, not as SIGBUS when a
  // fetch writes into the mapping. Fall back to a sparse file where the file
  // system cannot preallocate.
  int rc;
  do {
    rc = ::fallocate(w.fd_, 0, 0, static_cast<off_t>(w.file_bytes_));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    if (errno != EOPNOTSUPP && errno != ENOSYS) {
      return ErrnoStatus("fallocate", w.partial_path_, errno);
    }
    if (::ftruncate(w.fd_, static_cast<off_t>(w.file_bytes_)) != 0) {
      return ErrnoStatus("ftruncate", w.partial_path_, errno);
    }
  }
  void* base = ::mmap(nullptr, static_cast<size_t>(w.file_bytes_),
                      PROT_READ | PROT_WRITE, MAP_SHARED, w.fd_, 0);
  if (base == MAP_FAILED) return ErrnoStatus("mmap", w.partial_path_, errno);
  w.base_ = base;
  std::memcpy(base, header.data(), header.size());
  return w;
}

SafetensorsFileWriter::SafetensorsFileWriter(
    SafetensorsFileWriter&& other) noexcept
    : path_(std::move(other.path_)),
      partial_path_(std::move(other.partial_path_)),
      fd_(std::exchange(other.fd_, -1)),
      base_(std::exchange(other.base_, nullptr)),
      file_bytes_(std::exchange(other.file_bytes_, 0)),
      data_start_(std::exchange(other.data_start_, 0)),
      specs_(std::move(other.specs_)),
      begins_(std::move(other.begins_)),
      commit_attempted_(std::exchange(other.commit_attempted_, true)),
      committed_(std::exchange(other.committed_, true)) {
  other.partial_path_.clear();
}

SafetensorsFileWriter& SafetensorsFileWriter::operator=(
    SafetensorsFileWriter&& other) noexcept {
  if (this != &other) {
    Abandon();
    path_ = std::move(other.path_);
    partial_path_ = std::move(other.partial_path_);
    other.partial_path_.clear();
    fd_ = std::exchange(other.fd_, -1);
    base_ = std::exchange(other.base_, nullptr);
    file_bytes_ = std::exchange(other.file_bytes_, 0);
    data_start_ = std::exchange(other.data_start_, 0);
    specs_ = std::move(other.specs_);
    begins_ = std::move(other.begins_);
    commit_attempted_ = std::exchange(other.commit_attempted_, true);
    committed_ = std::exchange(other.committed_, true);
  }
  return *this;
}

SafetensorsFileWriter::~SafetensorsFileWriter() { Abandon(); }

void SafetensorsFileWriter::Abandon() {
  if (base_ != nullptr) ::munmap(base_, static_cast<size_t>(file_bytes_));
  base_ = nullptr;
  if (fd_ >= 0) ::close(fd_);
  // fd_ >= 0 or a failed commit means we created the partial file.
  if (!committed_ && !partial_path_.empty()) ::unlink(partial_path_.c_str());
  fd_ = -1;
  partial_path_.clear();
}

std::vector<TensorRef> SafetensorsFileWriter::tensors() {
  std::vector<TensorRef> refs;
  if (base_ == nullptr) return refs;
  refs.reserve(specs_.size());
  auto* data = static_cast<uint8_t*>(base_) + data_start_;
  for (size_t i = 0; i < specs_.size(); ++i) {
    const uint64_t next =
        i + 1 < specs_.size() ? begins_[i + 1] : file_bytes_ - data_start_;
    refs.push_back(TensorRef{specs_[i], data + begins_[i], next - begins_[i],
                             MemoryLocation::Host()});
  }
  return refs;
}

Status SafetensorsFileWriter::Commit(AfterCommit after) {
  if (commit_attempted_ || base_ == nullptr) {
    return FailedPrecondition("safetensors: " + path_ +
                              ": Commit() already called");
  }
  commit_attempted_ = true;
  if (::msync(base_, static_cast<size_t>(file_bytes_), MS_SYNC) != 0) {
    return ErrnoStatus("msync", partial_path_, errno);
  }
  if (after == AfterCommit::kUnmap) {
    ::munmap(base_, static_cast<size_t>(file_bytes_));
    base_ = nullptr;
  }
  if (::fsync(fd_) != 0) return ErrnoStatus("fsync", partial_path_, errno);
  ::close(fd_);
  fd_ = -1;
  if (::rename(partial_path_.c_str(), path_.c_str()) != 0) {
    return ErrnoStatus("rename", partial_path_ + " -> " + path_, errno);
  }
  committed_ = true;
  // Make the rename itself durable.
  const std::string dir = DirName(path_);
  const int dir_fd = OpenRetry(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return ErrnoStatus("open directory", dir, errno);
  const int rc = ::fsync(dir_fd);
  const int err = errno;
  ::close(dir_fd);
  if (rc != 0) return ErrnoStatus("fsync directory", dir, err);
  return Status::Ok();
}

}  // namespace tensorhub
