// Uses only the installed headers and libraries: an embedded hub, a holder
// that publishes one tensor and a reader that fetches it over the data plane.
// Prints "consumer: ok" and exits 0 when the bytes match.
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "tensorhub/client.h"
#include "tensorhub/host_buffer.h"
#include "tensorhub/hub.h"
#include "tensorhub/log_level.h"

namespace th = tensorhub;

namespace {
int Fail(const char* what, const th::Status& s) {
  std::fprintf(stderr, "consumer: %s: %s\n", what, s.ToString().c_str());
  return 1;
}
}  // namespace

int main() {
  th::SetLogLevel(th::LogLevel::kWarn);
  th::HubOptions ho;
  ho.listen_address = "127.0.0.1:0";
  auto hub = th::Hub::Start(ho);
  if (!hub.ok()) return Fail("hub", hub.status());

  th::ClientOptions co;
  co.hub_address = (*hub)->address();
  co.leave_timeout_ms = 0;
  auto holder = th::Client::Connect(co);
  if (!holder.ok()) return Fail("connect holder", holder.status());
  auto reader = th::Client::Connect(co);
  if (!reader.ok()) return Fail("connect reader", reader.status());

  // The published side in a HostBuffer (huge pages), the destination in
  // ordinary memory: both kinds work.
  auto src = th::HostBuffer::Allocate(1 << 20);
  if (!src.ok()) return Fail("host buffer", src.status());
  std::vector<uint8_t> dst(src->size());
  for (size_t i = 0; i < src->size(); ++i)
    src->data()[i] = static_cast<uint8_t>(i * 7 + 3);
  th::TensorRef in;
  in.spec = {"w", th::DType::kU8, {src->size()}};
  in.data = src->data();
  in.bytes = src->size();
  th::TensorRef out = in;
  out.data = dst.data();

  th::Status s = (*holder)->Publish("consumer", th::Version(1), {in});
  if (!s.ok()) return Fail("publish", s);
  th::FetchOptions fo;
  fo.serve = false;
  auto got = (*reader)->Fetch("consumer", th::Version(1), {out}, fo);
  if (!got.ok()) return Fail("fetch", got.status());
  if (std::memcmp(src->data(), dst.data(), src->size()) != 0) {
    std::fprintf(stderr, "consumer: fetched bytes differ\n");
    return 1;
  }
  s = (*holder)->Unpublish("consumer", th::Version(1));
  if (!s.ok()) return Fail("unpublish", s);
  std::printf("consumer: ok\n");
  return 0;
}
