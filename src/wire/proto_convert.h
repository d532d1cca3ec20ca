// Conversions between the control API's protobuf messages and our own types.
// Messages from the network are validated here: a malformed one becomes an
// INVALID_ARGUMENT, never a crash.
#ifndef TENSORHUB_WIRE_PROTO_CONVERT_H_
#define TENSORHUB_WIRE_PROTO_CONVERT_H_

#include <grpcpp/support/status.h>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

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

// A manifest as it travels whole: the hub's answers and a holder's
// manifest part (a data-plane read) carry these bytes, a deterministic
// serialization of its VersionManifest, so that the hub and every holder
// of a version encode it alike and one SHA-256 names it.
std::string EncodeManifest(const Manifest& m);
// Decodes and validates; `what` names the source in the error.
Result<Manifest> DecodeManifest(std::string_view bytes, std::string_view what);
using Sha256 = std::array<uint8_t, 32>;
Sha256 Sha256Of(std::string_view bytes);

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
