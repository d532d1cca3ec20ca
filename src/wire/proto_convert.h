// Conversions between the control API's protobuf messages and our own types.
// Messages from the network are validated here: a malformed one becomes an
// INVALID_ARGUMENT, never a crash.
#ifndef TENSORHUB_WIRE_PROTO_CONVERT_H_
#define TENSORHUB_WIRE_PROTO_CONVERT_H_

#include <grpcpp/support/status.h>

#include "common/manifest.h"
#include "tensorhub.pb.h"
#include "tensorhub/snapshot.h"
#include "tensorhub/status.h"
#include "tensorhub/types.h"

namespace tensorhub::wire {

void ToProto(const PartLayout& part, v1::PartManifest* out);
Result<PartLayout> FromProto(const v1::PartManifest& in);
void ToProto(const Manifest& m, v1::VersionManifest* out);
// Validates the result (Manifest::Validate).
Result<Manifest> FromProto(const v1::VersionManifest& in);

void ToProto(const Labels& l, v1::Labels* out);
Labels FromProto(const v1::Labels& in);

v1::VersionState ToProto(VersionState s);
VersionState FromProto(v1::VersionState s);

// `tensorhub top`'s view (the Snapshot RPC). FromProto keeps at most the
// kMaxSnapshot* entries of each list.
void ToProto(const HubSnapshot& s, v1::SnapshotResponse* out);
HubSnapshot FromProto(const v1::SnapshotResponse& in);

// Our codes share gRPC's numbering.
grpc::Status ToGrpc(const Status& s);
Status FromGrpc(const grpc::Status& s);

}  // namespace tensorhub::wire

#endif  // TENSORHUB_WIRE_PROTO_CONVERT_H_
