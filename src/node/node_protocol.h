// The node agent's socket protocol (docs/wire.md, "The node agent"): the
// messages between `tensorhub node` and the engines of its host, and their
// framing on a Unix stream socket. Encoding and decoding are pure; the
// socket helpers do the I/O and nothing else.
//
// Framing: a 4-byte little-endian length, then that many bytes of one JSON
// object. A reply that hands over the host copy carries its file descriptor
// (SCM_RIGHTS) on its first byte. Every length read from the socket is
// bounded before use; a malformed message ends the connection.
#ifndef TENSORHUB_NODE_NODE_PROTOCOL_H_
#define TENSORHUB_NODE_NODE_PROTOCOL_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tensorhub/status.h"
#include "tensorhub/types.h"

namespace tensorhub::node {

inline constexpr uint32_t kMaxRequestBytes = 64 << 10;
// A reply names every tensor of a version: 256 MiB is some 2 million.
inline constexpr uint32_t kMaxReplyBytes = 256u << 20;
inline constexpr int kProtocolVersion = 1;

enum class Op {
  kAcquire,  // the host copy of a version; the session then holds it
  kStage,    // start fetching a version onto the host; answer at once
  kRelease,  // the session is done with its copy (as is closing it)
  kStatus,   // what the agent holds
};

struct Request {
  Op op = Op::kStatus;
  std::string model;
  Version version = Version::Latest();
  // A reader group (the TP ranks of one engine): with Latest(), every
  // request naming the same group and step gets one version.
  std::string group;
  uint64_t step = 0;
  int64_t timeout_ms = 120000;
};

// Bounds: model and group names as the hub's (1 KiB, 256), a timeout
// within an hour. INVALID_ARGUMENT naming the field otherwise.
Result<Request> ParseRequest(std::string_view json);
std::string EncodeRequest(const Request& r);

// One tensor of the host copy: its place in the shared memory.
struct CopyTensor {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;
  uint64_t offset = 0;  // from the start of the memory; 64-byte aligned
  uint64_t bytes = 0;
};

// Places `tensors` back to back, each at a 64-byte boundary (any dtype's
// alignment), in the order given. Returns the bytes the memory needs.
uint64_t LayOut(std::vector<CopyTensor>& tensors);

struct AcquireReply {
  std::string model;
  Version version;
  uint64_t bytes = 0;  // of the memory handed over
  std::vector<CopyTensor> tensors;
  // Metadata of the version's parts whose values are UTF-8 text (the
  // others are named in binary_metadata_keys, without their values).
  std::vector<std::pair<std::string, std::string>> metadata;
  std::vector<std::string> binary_metadata_keys;
  std::string holder;        // the agent's worker id
  bool fetched_now = false;  // this request started the fetch
};
std::string EncodeAcquireReply(const AcquireReply& r);
// For tests and C++ readers.
Result<AcquireReply> ParseAcquireReply(std::string_view json);

// {"ok": true} plus fields, or an error. `fallback`: the agent cannot
// serve this request (it holds a newer version, or its copy is still read
// by others past the wait), and the engine should fetch it itself.
std::string EncodeOk(std::string_view fields_json = "{}");
std::string EncodeError(const Status& s, bool fallback);

// ---- Socket I/O ----

// A Unix stream socket address: "@NAME" is NAME in the abstract namespace
// (one per network namespace, no file), anything else a path.
// INVALID_ARGUMENT when too long (107 bytes).
Status CheckSocketName(std::string_view name);

// Listens at `name` (a path socket is created mode 0600, replacing a stale
// file no one listens on; FAILED_PRECONDITION if an agent listens there).
Result<int> Listen(std::string_view name, int backlog);
// Connects to `name` within `timeout_ms`. UNAVAILABLE when nothing listens.
Result<int> Connect(std::string_view name, int64_t timeout_ms);

// Sends one message (and `pass_fd` with it when >= 0) within `timeout_ms`.
Status SendMessage(int sock, std::string_view json, int pass_fd,
                   int64_t timeout_ms);
// Receives one message of at most `max_bytes`; a descriptor that came with
// it is stored in *received_fd (else -1; owned by the caller). Returns
// UNAVAILABLE "closed" on a clean end of stream before the first byte,
// DEADLINE_EXCEEDED after `timeout_ms` (-1: no deadline), and gives up
// early with ABORTED when `stop_fd` (>= 0) becomes readable.
Result<std::string> ReceiveMessage(int sock, uint32_t max_bytes,
                                   int64_t timeout_ms, int stop_fd,
                                   int* received_fd);

}  // namespace tensorhub::node

#endif  // TENSORHUB_NODE_NODE_PROTOCOL_H_
