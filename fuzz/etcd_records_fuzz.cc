// libFuzzer target for the records an HA hub reads back from etcd
// (ha/etcd_keys.h): whatever a key and value hold, decoding them into the
// durable state is OK or DATA_LOSS (naming the key), never a crash; and the
// escaping of key parts round-trips any bytes.
//
// Input: [key length byte][key][value].
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "ha/etcd_keys.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t key_len = std::min<size_t>(data[0], size - 1);
  const std::string key(reinterpret_cast<const char*>(data + 1), key_len);
  const std::string value(reinterpret_cast<const char*>(data + 1 + key_len),
                          size - 1 - key_len);
  static const char* const kPrefixes[] = {"/tensorhub/", "/"};
  for (const char* prefix : kPrefixes) {
    tensorhub::hub::DurableState state;
    // Under the prefix, and as a key of its own.
    for (const std::string& k : {std::string(prefix) + key, key}) {
      tensorhub::Status s = tensorhub::ha::DecodeInto(prefix, k, value, state);
      if (!s.ok() && s.code() != tensorhub::StatusCode::kDataLoss) {
        __builtin_trap();
      }
    }
  }
  const std::string escaped = tensorhub::ha::EscapeKeyPart(key);
  if (escaped.find('/') != std::string::npos) __builtin_trap();
  tensorhub::Result<std::string> back = tensorhub::ha::UnescapeKeyPart(escaped);
  if (!back.ok() || *back != key) __builtin_trap();
  (void)tensorhub::ha::UnescapeKeyPart(key);  // anything: an error, or a string
  return 0;
}
