// The hub's gRPC adapter called directly (no server, no sockets): what it
// answers about versions it does not know, inside and after the rebuild
// window that follows a start.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "common/deadline.h"
#include "hub/hub_service_internal.h"

namespace tensorhub::hub {
namespace {

struct Answers {
  grpc::Status resolve;
  grpc::Status resolve_latest;
  grpc::Status schedule;
};

// Asks a hub that started `age_ms` ago, with a rebuild window of
// `rebuild_ms`, about a model it has never heard of.
Answers AskAboutAnUnknownModel(int64_t rebuild_ms, int64_t age_ms) {
  HubConfig c;
  c.lease_ms = 1000;
  std::unique_ptr<v1::Hub::Service> s =
      NewHubService(c, "", rebuild_ms, NowMs() - age_ms);
  Answers a;
  grpc::ServerContext ctx1, ctx2, ctx3;
  v1::ResolveRequest rq;
  rq.set_worker_id("reader");
  rq.set_model("m");
  rq.set_version(7);
  v1::ResolveResponse rs;
  a.resolve = s->Resolve(&ctx1, &rq, &rs);
  rq.set_version(0);
  a.resolve_latest = s->Resolve(&ctx2, &rq, &rs);
  v1::ScheduleRequest sq;
  sq.set_worker_id("reader");
  sq.set_model("m");
  sq.set_version(7);
  sq.set_max_sources(4);
  v1::ScheduleResponse ss;
  a.schedule = s->Schedule(&ctx3, &sq, &ss);
  return a;
}

TEST(HubServiceTest, UnknownVersionIsUnavailableWhileTheHubRebuilds) {
  // Started 100 ms ago, rebuilding for a minute: no timing in play.
  Answers a = AskAboutAnUnknownModel(60000, 100);
  for (const grpc::Status* s : {&a.resolve, &a.resolve_latest, &a.schedule}) {
    EXPECT_EQ(s->error_code(), grpc::StatusCode::UNAVAILABLE)
        << s->error_message();
    EXPECT_NE(s->error_message().find("rebuilding its state from the workers"),
              std::string::npos)
        << s->error_message();
    // The state machine's own reason is kept.
    EXPECT_NE(s->error_message().find("'m'"), std::string::npos)
        << s->error_message();
  }
}

TEST(HubServiceTest, UnknownVersionIsNotFoundAfterTheRebuildWindow) {
  // Started a minute ago with a one-second window.
  Answers a = AskAboutAnUnknownModel(1000, 60000);
  for (const grpc::Status* s : {&a.resolve, &a.resolve_latest, &a.schedule}) {
    EXPECT_EQ(s->error_code(), grpc::StatusCode::NOT_FOUND)
        << s->error_message();
    EXPECT_EQ(s->error_message().find("rebuilding"), std::string::npos)
        << s->error_message();
  }
}

TEST(HubServiceTest, NoRebuildWindowAnswersFromTheTableAtOnce) {
  Answers a = AskAboutAnUnknownModel(0, 0);
  EXPECT_EQ(a.resolve.error_code(), grpc::StatusCode::NOT_FOUND)
      << a.resolve.error_message();
  EXPECT_EQ(a.schedule.error_code(), grpc::StatusCode::NOT_FOUND)
      << a.schedule.error_message();
}

}  // namespace
}  // namespace tensorhub::hub
