// tensorhub._core: the C++ client and the embedded hub, as seen from Python.
//
// This layer is deliberately thin. It takes tensors as plain tuples
// (name, dtype name, shape, address, byte count); the Python package
// (python/tensorhub/) turns numpy arrays and torch tensors into those tuples,
// checks contiguity and dtypes, and keeps the Python objects alive while the
// C++ library serves their memory. Here we only:
//   - release the GIL around every call that can block (network, drains),
//   - turn a non-OK Status into the matching tensorhub.Error subclass,
//   - convert result structs into dicts.
//
// Threading: a Client may be used from several Python threads at once; the
// C++ Client is thread-safe. close() may race with calls in flight: each call
// holds its own shared_ptr, so the C++ object is destroyed by whichever of
// them finishes last, always with the GIL released.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "log_forwarder.h"
#include "tensorhub/client.h"
#include "tensorhub/host_buffer.h"
#include "tensorhub/hub.h"
#include "tensorhub/log_level.h"
#include "tensorhub/reshard.h"
#include "tensorhub/status.h"
#include "tensorhub/types.h"
#include "tensorhub/version.h"

namespace py = pybind11;

namespace tensorhub::python {
namespace {

// Thrown (only inside this file) to carry a Status to the translator.
struct StatusException {
  Status status;
};

[[noreturn]] void Throw(const Status& s) { throw StatusException{s}; }

void Check(const Status& s) {
  if (!s.ok()) Throw(s);
}

template <typename T>
T Take(Result<T> r) {
  if (!r.ok()) Throw(r.status());
  return std::move(r).value();
}

// (name, dtype, shape, address, bytes, device): device -1 is host memory,
// N >= 0 the CUDA device of that ordinal.
using TensorTuple = std::tuple<std::string, std::string, std::vector<uint64_t>,
                               uintptr_t, uint64_t, int>;
// (tensor, (box offset, box extent), fp8 scales): a slice to fetch.
using PyBox = std::pair<std::vector<uint64_t>, std::vector<uint64_t>>;
using SliceTuple = std::tuple<TensorTuple, PyBox, std::vector<float>>;

std::vector<TensorRef> ToRefs(const std::vector<TensorTuple>& tuples) {
  std::vector<TensorRef> refs;
  refs.reserve(tuples.size());
  for (const auto& [name, dtype, shape, address, bytes, device] : tuples) {
    TensorRef r;
    r.spec.name = name;
    r.spec.dtype = Take(ParseDType(dtype));
    r.spec.shape = shape;
    r.data = reinterpret_cast<void*>(address);
    r.bytes = bytes;
    if (device >= 0) r.memory = MemoryLocation::Cuda(device);
    uint64_t want = Take(r.spec.ByteSize());
    if (want != bytes) {
      Throw(InvalidArgument("tensor '" + name + "' has " +
                            std::to_string(bytes) + " bytes, its spec needs " +
                            std::to_string(want)));
    }
    refs.push_back(std::move(r));
  }
  return refs;
}

py::dict LabelsDict(const Labels& l) {
  py::dict d;
  d["datacenter"] = l.datacenter;
  d["rack"] = l.rack;
  d["host"] = l.host;
  return d;
}

py::dict VersionDict(const VersionInfo& v) {
  py::dict d;
  d["model"] = v.model;
  d["version"] = v.version.value();
  d["state"] = std::string(VersionStateName(v.state));
  d["group_size"] = v.group_size;
  d["parts_published"] = v.parts_published;
  d["total_bytes"] = v.total_bytes;
  d["chunk_bytes"] = v.chunk_bytes;
  d["num_chunks"] = v.num_chunks;
  d["num_holders"] = v.num_holders;
  py::list tensors;
  for (const TensorInfo& t : v.tensors) {
    py::dict td;
    td["name"] = t.spec.name;
    td["dtype"] = std::string(DTypeName(t.spec.dtype));
    td["shape"] = t.spec.shape;
    td["rank"] = t.rank;
    td["bytes"] = t.bytes;
    tensors.append(td);
  }
  d["tensors"] = tensors;
  py::list metadata;
  for (const auto& [k, val] : v.metadata) {
    // Values are free-form bytes; hand them over undecoded only if they are
    // not UTF-8.
    PyObject* s = PyUnicode_DecodeUTF8(
        val.data(), static_cast<Py_ssize_t>(val.size()), "strict");
    if (s == nullptr) {
      PyErr_Clear();
      metadata.append(py::make_tuple(k, py::bytes(val)));
    } else {
      metadata.append(py::make_tuple(k, py::reinterpret_steal<py::str>(s)));
    }
  }
  d["metadata"] = metadata;
  d["retained"] = v.retained;
  py::list holders;
  for (const HolderInfo& h : v.holders) {
    py::dict hd;
    hd["worker"] = h.worker.value();
    hd["data_address"] = h.data_address;
    hd["labels"] = LabelsDict(h.labels);
    hd["reliable"] = h.worker_class == WorkerClass::kReliable;
    hd["chunks"] = h.chunks;
    holders.append(hd);
  }
  d["holders"] = holders;
  return d;
}

class PyClient {
 public:
  explicit PyClient(std::shared_ptr<Client> c) : client_(std::move(c)) {}

  // Runs with the GIL held, possibly during interpreter shutdown, so it does
  // not release the GIL: the C++ destructor joins threads that never take it.
  ~PyClient() = default;

  static std::unique_ptr<PyClient> Connect(const ClientOptions& options) {
    Result<std::unique_ptr<Client>> r = Status(StatusCode::kInternal, "unset");
    {
      py::gil_scoped_release nogil;
      r = Client::Connect(options);
    }
    return std::make_unique<PyClient>(
        std::shared_ptr<Client>(Take(std::move(r))));
  }

  void Publish(const std::string& model, uint64_t version,
               const std::vector<TensorTuple>& tensors,
               const PublishOptions& options) {
    std::shared_ptr<Client> c = Get();
    std::vector<TensorRef> refs = ToRefs(tensors);
    Status s;
    {
      py::gil_scoped_release nogil;
      s = c->Publish(model, Version(version), refs, options);
      c.reset();
    }
    Check(s);
  }

  void Unpublish(const std::string& model, uint64_t version, int64_t timeout_ms,
                 bool force) {
    std::shared_ptr<Client> c = Get();
    Status s;
    {
      py::gil_scoped_release nogil;
      s = c->Unpublish(model, Version(version), timeout_ms, force);
      c.reset();
    }
    Check(s);
  }

  py::dict Fetch(const std::string& model, uint64_t version,
                 const std::vector<TensorTuple>& tensors,
                 const FetchOptions& options) {
    std::shared_ptr<Client> c = Get();
    std::vector<TensorRef> refs = ToRefs(tensors);
    Result<FetchStats> r = Status(StatusCode::kInternal, "unset");
    {
      py::gil_scoped_release nogil;
      r = c->Fetch(model, Version(version), refs, options);
      c.reset();
    }
    return StatsDict(Take(std::move(r)));
  }

  // A partial fetch: each slice is (tensor, (offset, extent), fp8 scales);
  // the tensor receives that box of its logical tensor.
  py::dict FetchSlices(const std::string& model, uint64_t version,
                       const std::vector<SliceTuple>& slices,
                       const FetchOptions& options) {
    std::shared_ptr<Client> c = Get();
    std::vector<TensorSlice> refs;
    for (const auto& [tensor, box, scales] : slices) {
      refs.push_back(
          {ToRefs({tensor}).front(), Box{box.first, box.second}, scales});
    }
    Result<FetchStats> r = Status(StatusCode::kInternal, "unset");
    {
      py::gil_scoped_release nogil;
      r = c->FetchSlices(model, Version(version), refs, options);
      c.reset();
    }
    return StatsDict(Take(std::move(r)));
  }

  static py::dict StatsDict(const FetchStats& st) {
    py::dict d;
    d["version"] = st.version.value();
    d["bytes"] = st.bytes;
    d["seconds"] = st.seconds;
    d["resolve_seconds"] = st.resolve_seconds;
    d["schedule_seconds"] = st.schedule_seconds;
    d["first_byte_seconds"] = st.first_byte_seconds;
    d["transfer_seconds"] = st.transfer_seconds;
    d["verify_seconds"] = st.verify_seconds;
    d["register_seconds"] = st.register_seconds;
    d["total_seconds"] = st.total_seconds;
    d["bytes_same_host"] = st.bytes_same_host;
    d["sources_used"] = st.sources_used;
    d["chunk_retries"] = st.chunk_retries;
    d["chunks_stolen"] = st.chunks_stolen;
    d["tls_connections"] = st.tls_connections;
    d["kernel_tls_connections"] = st.kernel_tls_connections;
    py::list sources;
    for (const FetchSourceStats& src : st.sources) {
      py::dict sd;
      sd["worker"] = src.worker.value();
      sd["address"] = src.address;
      sd["bytes"] = src.bytes;
      sd["chunks"] = src.chunks;
      sd["was_filling"] = src.was_filling;
      sd["transport"] = src.transport;
      sd["delta_bytes"] = src.delta_bytes;
      sd["delta_wire_bytes"] = src.delta_wire_bytes;
      sources.append(std::move(sd));
    }
    d["sources"] = std::move(sources);
    d["manifest_source"] = st.manifest_source;
    d["manifest_bytes"] = st.manifest_bytes;
    d["delta_base"] = st.delta_base.value();
    d["bytes_from_delta"] = st.bytes_from_delta;
    d["delta_wire_bytes"] = st.delta_wire_bytes;
    d["delta_chunks_read_whole"] = st.delta_chunks_read_whole;
    return d;
  }

  py::list List() {
    std::shared_ptr<Client> c = Get();
    Result<std::vector<ModelInfo>> r = Status(StatusCode::kInternal, "unset");
    {
      py::gil_scoped_release nogil;
      r = c->List();
      c.reset();
    }
    std::vector<ModelInfo> models = Take(std::move(r));
    py::list out;
    for (const ModelInfo& m : models) {
      py::list versions;
      for (const VersionInfo& v : m.versions) versions.append(VersionDict(v));
      py::dict md;
      md["model"] = m.model;
      md["versions"] = versions;
      out.append(md);
    }
    return out;
  }

  py::dict Describe(const std::string& model, uint64_t version,
                    const std::string& group, uint64_t group_step) {
    std::shared_ptr<Client> c = Get();
    Result<VersionInfo> r = Status(StatusCode::kInternal, "unset");
    {
      py::gil_scoped_release nogil;
      r = group.empty()
              ? c->Describe(model, Version(version))
              : c->Describe(model, Version(version), group, group_step);
      c.reset();
    }
    return VersionDict(Take(std::move(r)));
  }

  void Retain(const std::string& model, uint64_t version, bool retain) {
    std::shared_ptr<Client> c = Get();
    Status s;
    {
      py::gil_scoped_release nogil;
      s = retain ? c->Retain(model, Version(version))
                 : c->Unretain(model, Version(version));
      c.reset();
    }
    Check(s);
  }

  std::string Id() { return Get()->id().value(); }
  std::string DataAddress() { return Get()->data_address(); }
  std::string MetricsAddress() { return Get()->metrics_address(); }

  bool Closed() {
    std::lock_guard<std::mutex> lock(mu_);
    return client_ == nullptr;
  }

  // Stops serving and leaves the hub. Returns once this handle is gone; a
  // call still running on another thread keeps the C++ client alive until
  // it returns.
  void Close() {
    std::shared_ptr<Client> c = Release();
    py::gil_scoped_release nogil;
    c.reset();
  }

 private:
  std::shared_ptr<Client> Get() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!client_) Throw(FailedPrecondition("the client is closed"));
    return client_;
  }
  std::shared_ptr<Client> Release() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::move(client_);
  }

  std::mutex mu_;
  std::shared_ptr<Client> client_;  // guarded by mu_; null once closed
};

class PyHub {
 public:
  static std::unique_ptr<PyHub> Start(
      std::string listen, int64_t lease_ms, std::string secret,
      uint32_t keep_latest, bool oversubscribed_racks, int64_t rebuild_ms,
      std::string metrics_listen, std::string tls_cert, std::string tls_key,
      std::string tls_client_ca, bool insecure, uint32_t heartbeat_budget_per_s,
      int64_t max_lease_ms) {
    HubOptions o;
    o.insecure = insecure;
    o.heartbeat_budget_per_s = heartbeat_budget_per_s;
    o.max_lease_ms = max_lease_ms;
    o.metrics_listen = std::move(metrics_listen);
    o.keep_latest = keep_latest;
    o.racks_oversubscribed = oversubscribed_racks;
    o.rebuild_ms = rebuild_ms;
    o.listen_address = std::move(listen);
    o.lease_ms = lease_ms;
    o.secret = std::move(secret);
    o.tls_cert_file = std::move(tls_cert);
    o.tls_key_file = std::move(tls_key);
    o.tls_client_ca_file = std::move(tls_client_ca);
    Result<std::unique_ptr<Hub>> r = Status(StatusCode::kInternal, "unset");
    {
      py::gil_scoped_release nogil;
      r = Hub::Start(o);
    }
    auto h = std::make_unique<PyHub>();
    h->server_ = Take(std::move(r));
    h->address_ = h->server_->address();
    h->metrics_address_ = h->server_->metrics_address();
    return h;
  }

  // Like ~PyClient: no GIL juggling, the hub's threads never take it.
  ~PyHub() {
    if (server_) server_->Shutdown();
  }

  const std::string& address() const { return address_; }
  const std::string& metrics_address() const { return metrics_address_; }
  bool closed() const { return server_ == nullptr; }

  void Close() {
    if (!server_) return;
    std::unique_ptr<Hub> s = std::move(server_);
    py::gil_scoped_release nogil;
    s->Shutdown();
    s.reset();
  }

 private:
  std::unique_ptr<Hub> server_;
  std::string address_;
  std::string metrics_address_;
};

}  // namespace
}  // namespace tensorhub::python

PYBIND11_MODULE(_core, m) {
  using namespace tensorhub;
  using namespace tensorhub::python;
  m.doc() =
      "Low-level binding of the TensorHub C++ client. Use the `tensorhub` "
      "package instead; this module's signatures may change.";

  py::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    try {
      std::rethrow_exception(p);
    } catch (const StatusException& e) {
      const Status& s = e.status;
      // tensorhub.errors builds the right subclass; it is pure Python and
      // cannot fail to import once the package is importable at all.
      try {
        py::object make =
            py::module_::import("tensorhub.errors").attr("_from_status");
        py::object exc =
            make(static_cast<int>(s.code()),
                 std::string(StatusCodeName(s.code())), s.message());
        PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())),
                        exc.ptr());
      } catch (py::error_already_set& inner) {
        inner.restore();
      }
    }
  });

  py::class_<HostBuffer>(m, "HostBuffer", py::buffer_protocol(),
                         "Zeroed host memory at a 2 MiB boundary, backed by "
                         "transparent huge pages where the kernel allows "
                         "them: publish from it and fetch into it for "
                         "same-host reads at memory speed. Exposes the "
                         "buffer protocol (numpy.frombuffer, "
                         "torch.frombuffer); freed when the last view of it "
                         "is gone.")
      .def(py::init([](uint64_t nbytes) {
             return Take(HostBuffer::Allocate(nbytes));
           }),
           py::arg("nbytes"))
      .def_buffer([](HostBuffer& b) {
        return py::buffer_info(b.data(), 1,
                               py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.size())}, {1},
                               /*readonly=*/false);
      })
      .def("__len__", &HostBuffer::size)
      .def_property_readonly("nbytes", &HostBuffer::size)
      .def_property_readonly("address",
                             [](const HostBuffer& b) {
                               return reinterpret_cast<uintptr_t>(b.data());
                             })
      .def_property_readonly("huge_pages", &HostBuffer::huge_pages,
                             "the kernel was asked for huge pages and its "
                             "THP mode allows them");
  m.def("transparent_huge_page_mode", &TransparentHugePageMode);

  // The options of a call, by name (tensorhub/client.h documents each
  // field): the Python package fills them in, never by position.
  py::class_<ClientOptions>(m, "ClientOptions")
      .def(py::init<>())
      .def_readwrite("hub_address", &ClientOptions::hub_address)
      .def_readwrite("name", &ClientOptions::name)
      .def_property(
          "datacenter",
          [](const ClientOptions& o) { return o.labels.datacenter; },
          [](ClientOptions& o, std::string v) {
            o.labels.datacenter = std::move(v);
          })
      .def_property(
          "rack", [](const ClientOptions& o) { return o.labels.rack; },
          [](ClientOptions& o, std::string v) { o.labels.rack = std::move(v); })
      .def_property(
          "host", [](const ClientOptions& o) { return o.labels.host; },
          [](ClientOptions& o, std::string v) { o.labels.host = std::move(v); })
      .def_property(
          "reliable",
          [](const ClientOptions& o) {
            return o.worker_class == WorkerClass::kReliable;
          },
          [](ClientOptions& o, bool reliable) {
            o.worker_class =
                reliable ? WorkerClass::kReliable : WorkerClass::kSpot;
          })
      .def_readwrite("data_listen_address", &ClientOptions::data_listen_address)
      .def_readwrite("data_advertise_host", &ClientOptions::data_advertise_host)
      .def_readwrite("rpc_timeout_ms", &ClientOptions::rpc_timeout_ms)
      .def_readwrite("connect_timeout_ms", &ClientOptions::connect_timeout_ms)
      .def_readwrite("heartbeat_interval_ms",
                     &ClientOptions::heartbeat_interval_ms)
      .def_readwrite("max_serving_connections",
                     &ClientOptions::max_serving_connections)
      .def_readwrite("secret", &ClientOptions::secret)
      .def_readwrite("tls_ca_file", &ClientOptions::tls_ca_file)
      .def_readwrite("tls_cert_file", &ClientOptions::tls_cert_file)
      .def_readwrite("tls_key_file", &ClientOptions::tls_key_file)
      .def_readwrite("tls_server_name", &ClientOptions::tls_server_name)
      .def_readwrite("data_tls", &ClientOptions::data_tls)
      .def_readwrite("insecure", &ClientOptions::insecure)
      .def_readwrite("leave_timeout_ms", &ClientOptions::leave_timeout_ms)
      .def_readwrite("metrics_listen", &ClientOptions::metrics_listen)
      .def_readwrite("deltas", &ClientOptions::deltas);

  py::class_<DeltaOptions>(m, "DeltaOptions")
      .def(py::init<>())
      .def_readwrite("serve", &DeltaOptions::serve)
      .def_readwrite("read", &DeltaOptions::read)
      .def_readwrite("datacenter_link_bytes_per_s",
                     &DeltaOptions::datacenter_link_bytes_per_s)
      .def_readwrite("wide_area_link_bytes_per_s",
                     &DeltaOptions::wide_area_link_bytes_per_s)
      .def_readwrite("apply_bytes_per_s", &DeltaOptions::apply_bytes_per_s)
      .def_readwrite("max_memory_bytes", &DeltaOptions::max_memory_bytes)
      .def_readwrite("wait_ms", &DeltaOptions::wait_ms);

  py::class_<PublishOptions>(m, "PublishOptions")
      .def(py::init<>())
      .def_readwrite("rank", &PublishOptions::rank)
      .def_readwrite("group_size", &PublishOptions::group_size)
      .def_readwrite("chunk_bytes", &PublishOptions::chunk_bytes)
      .def_readwrite("timeout_ms", &PublishOptions::timeout_ms)
      .def_readwrite("metadata", &PublishOptions::metadata)
      // {name: (global_shape, offset)}
      .def_property(
          "pieces",
          [](const PublishOptions& o) {
            std::map<std::string, PyBox> out;
            for (const auto& [name, p] : o.pieces) {
              out[name] = {p.global_shape, p.offset};
            }
            return out;
          },
          [](PublishOptions& o, const std::map<std::string, PyBox>& pieces) {
            o.pieces.clear();
            for (const auto& [name, p] : pieces) {
              o.pieces[name] = TensorPiece{p.first, p.second};
            }
          })
      .def_readwrite("segment_bytes", &PublishOptions::segment_bytes)
      .def_readwrite("chunk_checksum", &PublishOptions::chunk_checksum);

  py::class_<FetchOptions>(m, "FetchOptions")
      .def(py::init<>())
      .def_readwrite("timeout_ms", &FetchOptions::timeout_ms)
      .def_readwrite("connections", &FetchOptions::connections)
      .def_readwrite("max_sources", &FetchOptions::max_sources)
      .def_readwrite("serve", &FetchOptions::serve)
      .def_readwrite("serve_slices", &FetchOptions::serve_slices)
      .def_readwrite("group", &FetchOptions::group)
      .def_readwrite("group_step", &FetchOptions::group_step);

  py::class_<PyClient>(m, "Client")
      .def_static("connect", &PyClient::Connect, py::arg("options"))
      .def("publish", &PyClient::Publish, py::arg("model"), py::arg("version"),
           py::arg("tensors"), py::arg("options"))
      .def("unpublish", &PyClient::Unpublish, py::arg("model"),
           py::arg("version"), py::arg("timeout_ms"), py::arg("force"))
      .def("fetch", &PyClient::Fetch, py::arg("model"), py::arg("version"),
           py::arg("tensors"), py::arg("options"))
      .def("fetch_slices", &PyClient::FetchSlices, py::arg("model"),
           py::arg("version"), py::arg("slices"), py::arg("options"))
      .def("list", &PyClient::List)
      .def("describe", &PyClient::Describe, py::arg("model"),
           py::arg("version"), py::arg("group"), py::arg("group_step"))
      .def("retain", &PyClient::Retain, py::arg("model"), py::arg("version"),
           py::arg("retain"))
      .def("close", &PyClient::Close)
      .def_property_readonly("closed", &PyClient::Closed)
      .def_property_readonly("id", &PyClient::Id)
      .def_property_readonly("data_address", &PyClient::DataAddress)
      .def_property_readonly("metrics_address", &PyClient::MetricsAddress);

  py::class_<PyHub>(m, "Hub")
      .def_static("start", &PyHub::Start, py::arg("listen"),
                  py::arg("lease_ms"), py::arg("secret"),
                  py::arg("keep_latest"), py::arg("oversubscribed_racks"),
                  py::arg("rebuild_ms"), py::arg("metrics_listen"),
                  py::arg("tls_cert"), py::arg("tls_key"),
                  py::arg("tls_client_ca"), py::arg("insecure"),
                  py::arg("heartbeat_budget_per_s"), py::arg("max_lease_ms"))
      .def_property_readonly("address", &PyHub::address)
      .def_property_readonly("metrics_address", &PyHub::metrics_address)
      .def_property_readonly("closed", &PyHub::closed)
      .def("close", &PyHub::Close);

  m.def("_start_log_forwarding", &StartLogForwarding, py::arg("emit"),
        "Routes the C++ log lines to emit(level, file, line, message), "
        "called on one drainer thread with the GIL held "
        "(tensorhub._log).");
  m.def("_stop_log_forwarding", &StopLogForwarding,
        "Drains the queued lines, joins the drainer; lines go to stderr "
        "again.");
  m.def("_flush_log_forwarding", &FlushLogForwarding, py::arg("timeout_ms"),
        "Waits until the C++ lines logged so far reached Python's logging.");
  m.def("get_log_level", [] {
    switch (GetLogLevel()) {
      case LogLevel::kDebug:
        return "debug";
      case LogLevel::kInfo:
        return "info";
      case LogLevel::kWarn:
        return "warn";
      case LogLevel::kError:
        return "error";
    }
    return "info";
  });
  m.def("build_info", [] {
    const BuildInfo& b = GetBuildInfo();
    py::dict d;
    d["version"] = b.version;
    d["cuda"] = b.cuda;
    d["cuda_version"] = b.cuda_version;
    d["ucx"] = b.ucx;
    d["ucx_version"] = b.ucx_version;
    d["tls"] = b.tls;
    d["tls_library"] = b.tls_library;
    d["line"] = BuildInfoLine();
    return d;
  });

  m.def(
      "set_log_level",
      [](const std::string& level) {
        if (level == "debug") {
          SetLogLevel(LogLevel::kDebug);
        } else if (level == "info") {
          SetLogLevel(LogLevel::kInfo);
        } else if (level == "warn") {
          SetLogLevel(LogLevel::kWarn);
        } else if (level == "error") {
          SetLogLevel(LogLevel::kError);
        } else {
          Throw(InvalidArgument(
              "log level must be debug, info, warn or error, not '" + level +
              "'"));
        }
      },
      py::arg("level"));

  // Resharding helpers (include/tensorhub/reshard.h). A box is a pair of
  // lists (offset, extent) (PyBox).
  auto to_py = [](const Box& b) { return PyBox{b.offset, b.extent}; };
  auto dims_of = [](uint64_t heads, uint64_t kv_heads, uint64_t head_dim,
                    uint64_t experts) {
    return ModelDims{heads, kv_heads, head_dim, experts};
  };
  m.def(
      "classify_hf_tensor",
      [](const std::string& name) {
        return std::string(ShardKindName(ClassifyHfTensor(name)));
      },
      py::arg("name"));
  m.def(
      "tp_rank_box",
      [=](const std::string& name, const std::vector<uint64_t>& shape,
          uint32_t rank, uint32_t tp, uint64_t heads, uint64_t kv_heads,
          uint64_t head_dim, uint64_t experts) {
        return to_py(
            Take(TpRankBox(name, shape, rank, tp,
                           dims_of(heads, kv_heads, head_dim, experts))));
      },
      py::arg("name"), py::arg("shape"), py::arg("rank"), py::arg("tp"),
      py::arg("num_attention_heads") = 0, py::arg("num_key_value_heads") = 0,
      py::arg("head_dim") = 0, py::arg("num_experts") = 0);
  m.def(
      "ep_rank_box",
      [=](const std::string& name, const std::vector<uint64_t>& shape,
          uint32_t rank, uint32_t ep, uint64_t experts) {
        return to_py(
            Take(EpRankBox(name, shape, rank, ep, dims_of(0, 0, 0, experts))));
      },
      py::arg("name"), py::arg("shape"), py::arg("rank"), py::arg("ep"),
      py::arg("num_experts"));
  m.def(
      "fsdp_shards",
      [=](const std::vector<uint64_t>& shape, uint32_t k) {
        std::vector<PyBox> out;
        for (const Box& b : FsdpShards(shape, k)) out.push_back(to_py(b));
        return out;
      },
      py::arg("shape"), py::arg("k"));
  m.def(
      "tp_shards",
      [=](const std::vector<uint64_t>& shape, uint32_t dim, uint32_t k) {
        std::vector<PyBox> out;
        for (const Box& b : Take(TpShards(shape, dim, k))) {
          out.push_back(to_py(b));
        }
        return out;
      },
      py::arg("shape"), py::arg("dim"), py::arg("k"));
  // Converts `count` elements between buffers given by address (the Python
  // side passes numpy/torch data pointers and checks their sizes).
  m.def(
      "convert",
      [](const std::string& from, const std::string& to, uintptr_t src,
         uintptr_t dst, uint64_t count, float scale) {
        Check(ConvertDType(Take(ParseDType(from)), Take(ParseDType(to)),
                           reinterpret_cast<const void*>(src),
                           reinterpret_cast<void*>(dst), count, scale));
      },
      py::arg("from_dtype"), py::arg("to_dtype"), py::arg("src"),
      py::arg("dst"), py::arg("count"), py::arg("scale") = 1.0f);
  m.def("fp8_scale", &Fp8ScaleForAmax, py::arg("amax"));

  py::list dtypes;
  for (DType d : {DType::kBool, DType::kU8, DType::kI8, DType::kU16,
                  DType::kI16, DType::kF16, DType::kBF16, DType::kU32,
                  DType::kI32, DType::kF32, DType::kU64, DType::kI64,
                  DType::kF64, DType::kF8E4M3, DType::kF8E5M2}) {
    dtypes.append(py::make_tuple(std::string(DTypeName(d)), DTypeBytes(d)));
  }
  m.attr("DTYPES") = dtypes;
}
