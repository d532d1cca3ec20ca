// The node agent's protocol: requests parsed and bounded, the tensor
// layout, the acquire reply's round trip, and the framing over a real Unix
// socket (lengths bounded, a descriptor passed, stop and deadline honored).
#include "node/node_protocol.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>

namespace tensorhub::node {
namespace {

TEST(NodeProtocolTest, ParsesRequests) {
  auto r = ParseRequest(
      R"({"op":"acquire","model":"m","version":7,"group":"g","step":3,"timeout_ms":500})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->op, Op::kAcquire);
  EXPECT_EQ(r->model, "m");
  EXPECT_EQ(r->version, Version(7));
  EXPECT_EQ(r->group, "g");
  EXPECT_EQ(r->step, 3u);
  EXPECT_EQ(r->timeout_ms, 500);
  r = ParseRequest(R"({"op":"stage","model":"m","version":"latest"})");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->version.is_latest());
  EXPECT_EQ(ParseRequest(R"({"op":"status"})")->op, Op::kStatus);
  EXPECT_EQ(ParseRequest(R"({"op":"release"})")->op, Op::kRelease);
  // The encoder's output parses back to the same request.
  Request want;
  want.op = Op::kAcquire;
  want.model = "policy";
  want.version = Version(9);
  want.group = "engine-0";
  want.step = 4;
  want.timeout_ms = 1234;
  auto back = ParseRequest(EncodeRequest(want));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->model, "policy");
  EXPECT_EQ(back->version, Version(9));
  EXPECT_EQ(back->group, "engine-0");
  EXPECT_EQ(back->step, 4u);
  EXPECT_EQ(back->timeout_ms, 1234);
}

TEST(NodeProtocolTest, RefusesBadRequestsNamingTheField) {
  struct Case {
    const char* json;
    const char* names;
  } cases[] = {
      {"", "JSON"},
      {"[1]", "JSON object"},
      {R"({"model":"m"})", "op"},
      {R"({"op":"delete"})", "unknown op"},
      {R"({"op":"acquire"})", "model"},
      {R"({"op":"acquire","model":""})", "model"},
      {R"({"op":"acquire","model":"m","version":0})", "version"},
      {R"({"op":"acquire","model":"m","version":-3})", "version"},
      {R"({"op":"acquire","model":"m","version":"newest"})", "version"},
      {R"({"op":"acquire","model":"m","group":7})", "group"},
      {R"({"op":"acquire","model":"m","step":-1})", "step"},
      {R"({"op":"acquire","model":"m","timeout_ms":0})", "timeout_ms"},
      {R"({"op":"acquire","model":"m","timeout_ms":99999999})", "timeout_ms"},
  };
  for (const Case& c : cases) {
    auto r = ParseRequest(c.json);
    ASSERT_FALSE(r.ok()) << c.json;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.json;
    EXPECT_NE(r.status().message().find(c.names), std::string::npos)
        << c.json << ": " << r.status().message();
  }
  EXPECT_FALSE(ParseRequest(std::string(R"({"op":"acquire","model":")") +
                            std::string(300, 'x') + "\"}")
                   .ok());
}

TEST(NodeProtocolTest, LaysTensorsOutAligned) {
  std::vector<CopyTensor> t = {{"a", DType::kBF16, {3}, 0, 6},
                               {"b", DType::kF32, {16}, 0, 64},
                               {"c", DType::kU8, {1}, 0, 1}};
  EXPECT_EQ(LayOut(t), 129u);
  EXPECT_EQ(t[0].offset, 0u);
  EXPECT_EQ(t[1].offset, 64u);
  EXPECT_EQ(t[2].offset, 128u);
}

TEST(NodeProtocolTest, AcquireReplyRoundTrip) {
  AcquireReply r;
  r.model = "m";
  r.version = Version(3);
  r.tensors = {{"w", DType::kBF16, {2, 3}, 0, 12},
               {"b", DType::kF32, {3}, 0, 12}};
  r.bytes = LayOut(r.tensors);
  r.metadata = {{"aliases", "{}"}, {"raw", std::string("\xff\xfe", 2)}};
  r.holder = "w1-1";
  r.fetched_now = true;
  auto back = ParseAcquireReply(EncodeAcquireReply(r));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->version, Version(3));
  EXPECT_EQ(back->bytes, 76u);
  ASSERT_EQ(back->tensors.size(), 2u);
  EXPECT_EQ(back->tensors[1].name, "b");
  EXPECT_EQ(back->tensors[1].offset, 64u);
  EXPECT_EQ(back->tensors[0].shape, (std::vector<uint64_t>{2, 3}));
  // Binary values are not sent as text: only their keys are named.
  ASSERT_EQ(back->metadata.size(), 1u);
  EXPECT_EQ(back->metadata[0].first, "aliases");
  EXPECT_NE(EncodeAcquireReply(r).find("\"binary_metadata_keys\":[\"raw\"]"),
            std::string::npos);
  EXPECT_NE(EncodeError(Unavailable("gone"), true).find("\"fallback\":true"),
            std::string::npos);
}

TEST(NodeProtocolTest, FramesOverASocketWithADescriptor) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const std::string big(1 << 20, 'x');  // more than a socket buffer
  std::thread sender([&] {
    EXPECT_TRUE(SendMessage(sv[0], "{\"a\":1}", pipe_fds[1], 5000).ok());
    EXPECT_TRUE(SendMessage(sv[0], big, -1, 5000).ok());
  });
  int fd = -1;
  auto m = ReceiveMessage(sv[1], 1024, 5000, -1, &fd);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(*m, "{\"a\":1}");
  ASSERT_GE(fd, 0);
  // The descriptor is the pipe's write end: a byte through it arrives.
  ASSERT_EQ(write(fd, "z", 1), 1);
  char c = 0;
  ASSERT_EQ(read(pipe_fds[0], &c, 1), 1);
  EXPECT_EQ(c, 'z');
  close(fd);
  m = ReceiveMessage(sv[1], 2 << 20, 5000, -1, &fd);
  sender.join();
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->size(), big.size());
  EXPECT_EQ(fd, -1);
  // Over the bound: refused before anything is allocated.
  std::thread again([&] { (void)SendMessage(sv[0], big, -1, 5000); });
  m = ReceiveMessage(sv[1], 1024, 5000, -1, &fd);
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  close(sv[1]);
  again.join();
  // A clean close: UNAVAILABLE "closed".
  m = ReceiveMessage(sv[0], 1024, 5000, -1, &fd);
  EXPECT_EQ(m.status().code(), StatusCode::kUnavailable);
  close(sv[0]);
  close(pipe_fds[0]);
  close(pipe_fds[1]);
}

TEST(NodeProtocolTest, ReceiveEndsAtItsDeadlineOrWhenStopped) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  auto m = ReceiveMessage(sv[1], 1024, 1, -1, nullptr);
  EXPECT_EQ(m.status().code(), StatusCode::kDeadlineExceeded);
  int stop[2];
  ASSERT_EQ(pipe(stop), 0);
  ASSERT_EQ(write(stop[1], "s", 1), 1);
  m = ReceiveMessage(sv[1], 1024, -1, stop[0], nullptr);
  EXPECT_EQ(m.status().code(), StatusCode::kAborted);
  for (int fd : {sv[0], sv[1], stop[0], stop[1]}) close(fd);
}

TEST(NodeProtocolTest, ListensOnAbstractAndPathSockets) {
  const std::string abstract =
      "@tensorhub-node-test-" + std::to_string(getpid());
  auto l = Listen(abstract, 4);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  auto again = Listen(abstract, 4);
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
  auto c = Connect(abstract, 1000);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  close(*c);
  close(*l);
  EXPECT_EQ(Connect(abstract, 1000).status().code(), StatusCode::kUnavailable);

  char dir[] = "/tmp/th-node-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/agent.sock";
  l = Listen(path, 4);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(Listen(path, 4).status().code(), StatusCode::kFailedPrecondition);
  close(*l);  // the file stays, as after an agent that died
  l = Listen(path, 4);
  ASSERT_TRUE(l.ok()) << "a stale socket file is replaced: "
                      << l.status().ToString();
  close(*l);
  unlink(path.c_str());
  rmdir(dir);
  EXPECT_EQ(CheckSocketName(std::string(200, 'a')).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tensorhub::node
