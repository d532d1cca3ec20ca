#include "wire/proto_convert.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <openssl/sha.h>

#include <climits>

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
  out->set_chunk_checksum(static_cast<v1::ChunkChecksum>(part.chunk_checksum));
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
  // Unknown kinds are kept as they are: Manifest::ValidatePart refuses
  // them, with the kind and what to do.
  part.chunk_checksum =
      static_cast<ChunkChecksum>(static_cast<uint32_t>(in.chunk_checksum()));
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

std::string EncodeManifest(const Manifest& m) {
  v1::VersionManifest vm;
  ToProto(m, &vm);
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    vm.SerializeToCodedStream(&coded);
  }
  return out;
}

Result<Manifest> DecodeManifest(std::string_view bytes, std::string_view what) {
  v1::VersionManifest vm;
  if (bytes.size() > static_cast<size_t>(INT32_MAX) ||
      !vm.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return InvalidArgument(std::string(what) + ": a malformed manifest");
  }
  Result<Manifest> m = FromProto(vm);
  if (!m.ok()) return m.status().WithContext(std::string(what));
  return m;
}

Sha256 Sha256Of(std::string_view bytes) {
  Sha256 out{};
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(),
         out.data());
  return out;
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

void ToProto(const HubSnapshot& s, v1::SnapshotResponse* out) {
  out->set_workers(s.workers);
  out->set_models_total(s.models_total);
  for (const SnapshotModel& m : s.models) {
    v1::SnapshotModel* pm = out->add_models();
    pm->set_model(m.model);
    pm->set_versions_total(m.versions_total);
    for (const SnapshotVersion& v : m.versions) {
      v1::SnapshotVersion* pv = pm->add_versions();
      pv->set_version(v.version.value());
      pv->set_state(ToProto(v.state));
      pv->set_total_bytes(v.total_bytes);
      pv->set_retained(v.retained);
      pv->set_holders_complete(v.holders_complete);
      pv->set_holders_filling(v.holders_filling);
      for (const SnapshotHolder& h : v.holders) {
        v1::SnapshotHolder* ph = pv->add_holders();
        ph->set_worker_id(h.worker.value());
        ph->set_name(h.name);
        ph->set_filling(h.filling);
      }
    }
  }
  out->set_transfers_total(s.transfers_total);
  for (const SnapshotTransfer& t : s.transfers) {
    v1::SnapshotTransfer* pt = out->add_transfers();
    pt->set_model(t.model);
    pt->set_version(t.version.value());
    pt->set_reader_id(t.reader.value());
    pt->set_reader_name(t.reader_name);
    pt->set_reported(t.reported);
    pt->set_bytes_done(t.bytes_done);
    pt->set_bytes_total(t.bytes_total);
    pt->set_elapsed_ms(t.elapsed_ms);
    pt->set_bytes_per_second(t.bytes_per_second);
    for (const SnapshotSource& src : t.sources) {
      v1::SnapshotSource* ps = pt->add_sources();
      ps->set_worker_id(src.worker.value());
      ps->set_name(src.name);
      ps->set_bytes(src.bytes);
      ps->set_bytes_per_second(src.bytes_per_second);
    }
  }
  for (const SnapshotHolderRate& r : s.slowest) {
    v1::SnapshotHolderRate* pr = out->add_slowest();
    pr->set_worker_id(r.worker.value());
    pr->set_name(r.name);
    pr->set_bytes_per_second(r.bytes_per_second);
    pr->set_samples(r.samples);
  }
}

HubSnapshot FromProto(const v1::SnapshotResponse& in) {
  HubSnapshot s;
  s.workers = in.workers();
  s.models_total = in.models_total();
  for (const v1::SnapshotModel& pm : in.models()) {
    if (s.models.size() >= kMaxSnapshotModels) break;
    SnapshotModel& m = s.models.emplace_back();
    m.model = pm.model();
    m.versions_total = pm.versions_total();
    for (const v1::SnapshotVersion& pv : pm.versions()) {
      if (m.versions.size() >= kMaxSnapshotVersions) break;
      SnapshotVersion& v = m.versions.emplace_back();
      v.version = Version(pv.version());
      v.state = FromProto(pv.state());
      v.total_bytes = pv.total_bytes();
      v.retained = pv.retained();
      v.holders_complete = pv.holders_complete();
      v.holders_filling = pv.holders_filling();
      for (const v1::SnapshotHolder& ph : pv.holders()) {
        if (v.holders.size() >= kMaxSnapshotHolders) break;
        v.holders.push_back(
            {WorkerId(ph.worker_id()), ph.name(), ph.filling()});
      }
    }
  }
  s.transfers_total = in.transfers_total();
  for (const v1::SnapshotTransfer& pt : in.transfers()) {
    if (s.transfers.size() >= kMaxSnapshotTransfers) break;
    SnapshotTransfer& t = s.transfers.emplace_back();
    t.model = pt.model();
    t.version = Version(pt.version());
    t.reader = WorkerId(pt.reader_id());
    t.reader_name = pt.reader_name();
    t.reported = pt.reported();
    t.bytes_done = pt.bytes_done();
    t.bytes_total = pt.bytes_total();
    t.elapsed_ms = pt.elapsed_ms();
    t.bytes_per_second = pt.bytes_per_second();
    for (const v1::SnapshotSource& ps : pt.sources()) {
      if (t.sources.size() >= kMaxProgressSources) break;
      t.sources.push_back({WorkerId(ps.worker_id()), ps.name(), ps.bytes(),
                           ps.bytes_per_second()});
    }
  }
  for (const v1::SnapshotHolderRate& pr : in.slowest()) {
    if (s.slowest.size() >= kMaxSnapshotSlowest) break;
    s.slowest.push_back({WorkerId(pr.worker_id()), pr.name(),
                         pr.bytes_per_second(), pr.samples()});
  }
  return s;
}

}  // namespace tensorhub::wire
