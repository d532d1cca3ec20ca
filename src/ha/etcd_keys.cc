#include "ha/etcd_keys.h"

#include <openssl/sha.h>

#include <charconv>
#include <sstream>
#include <vector>

namespace tensorhub::ha {
namespace {

constexpr char kHex[] = "0123456789ABCDEF";

const std::string kHighest = "highest/";
const std::string kPin = "pin/";
const std::string kGroup = "group/";

Result<uint64_t> ParseU64(const std::string& s) {
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) {
    return InvalidArgument("'" + s + "' is not a number");
  }
  return v;
}

// "A/B" -> {A, B}, split at the only '/' (escaped parts have none).
Result<std::pair<std::string, std::string>> SplitTwo(const std::string& s) {
  size_t slash = s.find('/');
  if (slash == std::string::npos || s.find('/', slash + 1) != std::string::npos)
    return InvalidArgument("expected two parts");
  return std::make_pair(s.substr(0, slash), s.substr(slash + 1));
}

std::string EncodeGroup(const hub::GroupRecord& r) {
  std::string out = std::to_string(r.forgot_below);
  for (const auto& [step, version] : r.steps) {
    out += " " + std::to_string(step) + "=" + std::to_string(version.value());
  }
  return out;
}

Result<hub::GroupRecord> DecodeGroup(const std::string& value) {
  hub::GroupRecord r;
  std::istringstream in(value);
  std::string word;
  if (!(in >> word)) return InvalidArgument("empty group record");
  TH_ASSIGN_OR_RETURN(r.forgot_below, ParseU64(word));
  while (in >> word) {
    size_t eq = word.find('=');
    if (eq == std::string::npos) return InvalidArgument("no '=' in " + word);
    TH_ASSIGN_OR_RETURN(uint64_t step, ParseU64(word.substr(0, eq)));
    TH_ASSIGN_OR_RETURN(uint64_t version, ParseU64(word.substr(eq + 1)));
    r.steps[step] = Version(version);
  }
  return r;
}

Status DecodeFact(const std::string& rest, const std::string& value,
                  hub::DurableState& state) {
  if (rest.rfind(kHighest, 0) == 0) {
    TH_ASSIGN_OR_RETURN(std::string model,
                        UnescapeKeyPart(rest.substr(kHighest.size())));
    TH_ASSIGN_OR_RETURN(uint64_t v, ParseU64(value));
    state.highest[model] = Version(v);
    return Status::Ok();
  }
  if (rest.rfind(kPin, 0) == 0) {
    TH_ASSIGN_OR_RETURN(auto parts, SplitTwo(rest.substr(kPin.size())));
    TH_ASSIGN_OR_RETURN(std::string model, UnescapeKeyPart(parts.first));
    TH_ASSIGN_OR_RETURN(uint64_t v, ParseU64(parts.second));
    state.pins.insert({model, Version(v)});
    return Status::Ok();
  }
  if (rest.rfind(kGroup, 0) == 0) {
    TH_ASSIGN_OR_RETURN(auto parts, SplitTwo(rest.substr(kGroup.size())));
    TH_ASSIGN_OR_RETURN(std::string model, UnescapeKeyPart(parts.first));
    TH_ASSIGN_OR_RETURN(std::string group, UnescapeKeyPart(parts.second));
    TH_ASSIGN_OR_RETURN(hub::GroupRecord r, DecodeGroup(value));
    state.groups[{model, group}] = std::move(r);
    return Status::Ok();
  }
  return Status::Ok();  // not a durable fact of this version: skipped
}

}  // namespace

std::string EscapeKeyPart(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '%' || c == '/' || c <= ' ' || c > '~') {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

Result<std::string> UnescapeKeyPart(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    if (i + 2 >= s.size()) {
      return InvalidArgument("truncated escape in '" + s + "'");
    }
    int v = 0;
    for (int k = 1; k <= 2; ++k) {
      char c = s[i + k];
      const char* p = std::char_traits<char>::find(kHex, 16, c);
      if (p == nullptr) return InvalidArgument("bad escape in '" + s + "'");
      v = v * 16 + static_cast<int>(p - kHex);
    }
    out += static_cast<char>(v);
    i += 2;
  }
  return out;
}

std::string LeaderKey(const std::string& prefix) { return prefix + "leader"; }
std::string SecretIdKey(const std::string& prefix) {
  return prefix + "secret-id";
}

KeyWrite EncodeChange(const std::string& prefix, const hub::DurableChange& c) {
  using Kind = hub::DurableChange::Kind;
  const std::string model = EscapeKeyPart(c.model);
  switch (c.kind) {
    case Kind::kHighest:
      return {prefix + kHighest + model, std::to_string(c.version.value())};
    case Kind::kPin:
      return {prefix + kPin + model + "/" + std::to_string(c.version.value()),
              std::string()};
    case Kind::kUnpin:
      return {prefix + kPin + model + "/" + std::to_string(c.version.value()),
              std::nullopt};
    case Kind::kGroup:
      return {prefix + kGroup + model + "/" + EscapeKeyPart(c.group),
              EncodeGroup(c.record)};
    case Kind::kGroupGone:
      return {prefix + kGroup + model + "/" + EscapeKeyPart(c.group),
              std::nullopt};
  }
  return {};
}

Status DecodeInto(const std::string& prefix, const std::string& key,
                  const std::string& value, hub::DurableState& state) {
  if (key.rfind(prefix, 0) != 0) return Status::Ok();
  Status s = DecodeFact(key.substr(prefix.size()), value, state);
  if (!s.ok()) {
    return DataLoss("etcd key '" + key + "' (value '" + value.substr(0, 64) +
                    "') is malformed: " + s.message());
  }
  return s;
}

std::string SecretIdentity(const std::string& secret) {
  const std::string label = "tensorhub hub-set secret v1";
  std::string input = label + '\0' + secret;
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(input.data()), input.size(),
         md);
  std::string out;
  for (unsigned char b : md) {
    out += "0123456789abcdef"[b >> 4];
    out += "0123456789abcdef"[b & 15];
  }
  return out;
}

}  // namespace tensorhub::ha
