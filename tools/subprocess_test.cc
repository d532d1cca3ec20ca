// Subprocess (tools/subprocess.h): how a child ended, as the harnesses and
// multi-process tests report it. Real child processes (/bin/sh).
#include "subprocess.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

namespace tensorhub::cli {
namespace {

// A child that exits with code 3 at once (the wrapper runs instead of this
// binary: `sh -c "exit 3" <this binary>`).
Result<Subprocess> ExitsWith3() {
  return Subprocess::Spawn({}, {}, {"/bin/sh", "-c", "exit 3"});
}

TEST(SubprocessTest, SaysHowAChildEnded) {
  Result<Subprocess> p = ExitsWith3();
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->HowItEnded(30000), "exited with code 3");
  EXPECT_EQ(p->Stop(0), 3 << 8);
}

TEST(SubprocessTest, AChildReapedElsewhereIsNotSaidToHaveExitedCleanly) {
  Result<Subprocess> p = ExitsWith3();
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  // Someone else (a SIGCHLD handler, another waitpid) reaps it first.
  int status = 0;
  ASSERT_EQ(::waitpid(p->pid(), &status, 0), p->pid());
  EXPECT_EQ(p->HowItEnded(1000),
            "ended; how is not known (it was reaped elsewhere)");
  EXPECT_EQ(p->Stop(0), -1);
}

}  // namespace
}  // namespace tensorhub::cli
