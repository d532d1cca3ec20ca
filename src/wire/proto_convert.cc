#include "wire/proto_convert.h"

namespace tensorhub::wire {

void ToProto(const PartLayout& part, v1::PartManifest* out) {
  out->set_rank(part.rank);
  out->set_part_bytes(part.part_bytes);
  for (const TensorLayout& t : part.tensors) {
    v1::TensorEntry* e = out->add_tensors();
    e->set_name(t.spec.name);
    e->set_dtype(std::string(DTypeName(t.spec.dtype)));
    for (uint64_t d : t.spec.shape) e->add_shape(d);
    e->set_offset(t.offset);
    e->set_bytes(t.bytes);
    for (uint64_t d : t.global_shape) e->add_global_shape(d);
    for (uint64_t d : t.box_offset) e->add_box_offset(d);
    e->set_seg_rows(t.seg.rows);
    e->set_seg_cols(t.seg.cols);
    for (uint64_t c : t.seg_xxh3) e->add_seg_xxh3(c);
  }
  for (uint64_t c : part.chunk_xxh3) out->add_chunk_xxh3(c);
  for (const auto& [k, v] : part.metadata) {
    v1::MetadataEntry* e = out->add_metadata();
    e->set_key(k);
    e->set_value(v);
  }
}

Result<PartLayout> FromProto(const v1::PartManifest& in) {
  if (static_cast<uint64_t>(in.tensors_size()) > kMaxTensorsPerPart ||
      static_cast<uint64_t>(in.chunk_xxh3_size()) > kMaxChunksPerVersion) {
    return InvalidArgument("part manifest too large");
  }
  PartLayout part;
  part.rank = in.rank();
  part.part_bytes = in.part_bytes();
  part.tensors.reserve(in.tensors_size());
  for (const v1::TensorEntry& e : in.tensors()) {
    if (e.shape_size() > 16 || e.global_shape_size() > 16 ||
        e.box_offset_size() > 16) {
      return InvalidArgument("tensor '" + e.name() + "' has rank > 16");
    }
    if (static_cast<uint64_t>(e.seg_xxh3_size()) > kMaxSegmentsPerVersion) {
      return InvalidArgument("tensor '" + e.name() +
                             "' has too many segment checksums");
    }
    TensorLayout t;
    t.spec.name = e.name();
    TH_ASSIGN_OR_RETURN(t.spec.dtype, ParseDType(e.dtype()));
    t.spec.shape.assign(e.shape().begin(), e.shape().end());
    t.offset = e.offset();
    t.bytes = e.bytes();
    t.global_shape.assign(e.global_shape().begin(), e.global_shape().end());
    t.box_offset.assign(e.box_offset().begin(), e.box_offset().end());
    t.seg = {e.seg_rows(), e.seg_cols()};
    t.seg_xxh3.assign(e.seg_xxh3().begin(), e.seg_xxh3().end());
    part.tensors.push_back(std::move(t));
  }
  part.chunk_xxh3.assign(in.chunk_xxh3().begin(), in.chunk_xxh3().end());
  if (static_cast<size_t>(in.metadata_size()) > kMaxMetadataEntries) {
    return InvalidArgument("part manifest has too many metadata entries");
  }
  for (const v1::MetadataEntry& e : in.metadata()) {
    part.metadata.emplace_back(e.key(), e.value());
  }
  return part;
}

void ToProto(const Manifest& m, v1::VersionManifest* out) {
  out->set_group_size(m.group_size());
  out->set_chunk_bytes(m.chunk_bytes());
  for (const PartLayout& p : m.parts()) ToProto(p, out->add_parts());
}

Result<Manifest> FromProto(const v1::VersionManifest& in) {
  if (in.parts_size() > static_cast<int>(kMaxGroupSize)) {
    return InvalidArgument("manifest has too many parts");
  }
  std::vector<PartLayout> parts;
  for (const v1::PartManifest& p : in.parts()) {
    TH_ASSIGN_OR_RETURN(PartLayout part, FromProto(p));
    parts.push_back(std::move(part));
  }
  Manifest m(in.group_size(), in.chunk_bytes(), std::move(parts));
  TH_RETURN_IF_ERROR(m.Validate());
  return m;
}

void ToProto(const Labels& l, v1::Labels* out) {
  out->set_datacenter(l.datacenter);
  out->set_rack(l.rack);
  out->set_host(l.host);
}

Labels FromProto(const v1::Labels& in) {
  return Labels{in.datacenter(), in.rack(), in.host()};
}

v1::VersionState ToProto(VersionState s) {
  switch (s) {
    case VersionState::kPending:
      return v1::PENDING;
    case VersionState::kCommitted:
      return v1::COMMITTED;
    case VersionState::kAborted:
      return v1::ABORTED;
    case VersionState::kUnavailable:
      return v1::UNAVAILABLE;
  }
  return v1::PENDING;
}

VersionState FromProto(v1::VersionState s) {
  switch (s) {
    case v1::COMMITTED:
      return VersionState::kCommitted;
    case v1::ABORTED:
      return VersionState::kAborted;
    case v1::UNAVAILABLE:
      return VersionState::kUnavailable;
    default:
      return VersionState::kPending;
  }
}

grpc::Status ToGrpc(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), s.message());
}

Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return Status::Ok();
  switch (s.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DATA_LOSS:
      return Status(static_cast<StatusCode>(s.error_code()), s.error_message());
    default:
      return Status(StatusCode::kInternal,
                    "hub RPC failed with gRPC code " +
                        std::to_string(static_cast<int>(s.error_code())) +
                        ": " + s.error_message());
  }
}

}  // namespace tensorhub::wire
