// A small client of etcd's v3 API over gRPC (the KV, Lease and Watch
// services of proto/etcd/, etcd's own messages), in our own types: what the
// HA coordinator (etcd_coordinator.h) needs, and what the tests use to look
// at etcd. The generated etcd code appears in etcd_client.cc only.
//
// Endpoints are "HOST:PORT[,HOST:PORT...]", the members' client URLs
// without the scheme (plain http, as etcd serves on loopback; TLS to etcd
// is not supported yet). A call goes to the member that answered last; a
// member that cannot be reached (UNAVAILABLE) passes the call to the next
// one, within the call's deadline. Channels connect lazily: Create never
// waits.
//
// Every call takes a Deadline and returns by it. Errors: UNAVAILABLE or
// DEADLINE_EXCEEDED when etcd cannot be reached in time (worth a retry);
// etcd's own refusals keep etcd's code and message.
//
// Threads: every method may be called from several threads at once.
#ifndef TENSORHUB_HA_ETCD_CLIENT_H_
#define TENSORHUB_HA_ETCD_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "tensorhub/status.h"

namespace tensorhub::ha {

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t lease = 0;
};

// One comparison of a transaction's guard (etcd's Compare): the key's
// `target` field against `number` (revisions, lease) or `value`.
struct Compare {
  enum class Target { kCreateRevision, kModRevision, kValue, kLease };
  enum class Op { kEqual, kNotEqual, kGreater, kLess };
  std::string key;
  Target target = Target::kCreateRevision;
  Op op = Op::kEqual;
  int64_t number = 0;
  std::string value;

  // The key was created at `revision` (0: the key does not exist).
  static Compare CreatedAt(std::string key, int64_t revision) {
    return {std::move(key), Target::kCreateRevision, Op::kEqual, revision, {}};
  }
};

// One operation of a transaction's branch.
struct TxnOp {
  enum class Kind { kPut, kDelete, kGet };
  Kind kind = Kind::kGet;
  std::string key;
  std::string value;  // kPut
  int64_t lease = 0;  // kPut: attach to this lease (0: none)

  static TxnOp Put(std::string key, std::string value, int64_t lease = 0) {
    return {Kind::kPut, std::move(key), std::move(value), lease};
  }
  static TxnOp Delete(std::string key) {
    return {Kind::kDelete, std::move(key), {}, 0};
  }
  static TxnOp Get(std::string key) {
    return {Kind::kGet, std::move(key), {}, 0};
  }
};

struct TxnResult {
  bool succeeded = false;  // the guard held: the success branch ran
  int64_t revision = 0;    // the store's revision after the transaction
  // For each kGet of the branch that ran, in order: the key, if it exists.
  std::vector<std::optional<KeyValue>> gets;
};

struct RangeResult {
  std::vector<KeyValue> kvs;
  bool more = false;     // the limit cut the range short
  int64_t revision = 0;  // the store's revision the range was read at
};

struct LeaseGrant {
  int64_t id = 0;
  int64_t ttl_s = 0;  // what etcd granted (it may raise a short TTL)
};

struct WatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  KeyValue kv;  // for kDelete: the key and the revision of the deletion
};

class EtcdClient {
 public:
  // INVALID_ARGUMENT for an empty or malformed endpoint list (at most 16).
  static Result<std::unique_ptr<EtcdClient>> Create(
      const std::string& endpoints);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  const std::string& endpoints() const;

  // Keys in [key, range_end) (range_end empty: `key` alone), at most
  // `limit` (0: no limit), read at `revision` (0: the newest).
  Result<RangeResult> Range(const std::string& key,
                            const std::string& range_end, int64_t limit,
                            int64_t revision, const Deadline& deadline);
  Result<TxnResult> Txn(const std::vector<Compare>& guard,
                        const std::vector<TxnOp>& success,
                        const std::vector<TxnOp>& failure,
                        const Deadline& deadline);
  Result<LeaseGrant> GrantLease(int64_t ttl_s, const Deadline& deadline);
  // Renews a lease once: the TTL granted in seconds, or 0 if the lease is
  // gone (expired or revoked).
  Result<int64_t> KeepAlive(int64_t lease_id, const Deadline& deadline);
  Status RevokeLease(int64_t lease_id, const Deadline& deadline);
  // Waits for the first change of `key` at a revision >= start_revision
  // (which may lie in the past, so nothing between a read and the watch is
  // missed). nullopt if none came by the deadline or CancelWaits() ended
  // the wait. An error if etcd refused the watch (e.g. the revision was
  // compacted: read the key again and watch from there).
  Result<std::optional<WatchEvent>> WaitForChange(const std::string& key,
                                                  int64_t start_revision,
                                                  const Deadline& deadline);
  // Ends a WaitForChange in progress, and every later one at once.
  void CancelWaits();

  // The end of the range of every key that starts with `prefix`.
  static std::string PrefixEnd(const std::string& prefix);

 private:
  struct Impl;
  explicit EtcdClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tensorhub::ha

#endif  // TENSORHUB_HA_ETCD_CLIENT_H_
