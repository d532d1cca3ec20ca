#include "process_util.h"

#include <gtest/gtest.h>

#include <sstream>
#include <utility>

#include "common/deadline.h"

namespace tensorhub::testing {

std::string Word(const std::string& line, int i) {
  std::istringstream in(line);
  std::string w;
  for (int k = 0; k <= i; ++k) {
    if (!(in >> w)) return "";
  }
  return w;
}

cli::Subprocess MustSpawn(const std::vector<std::string>& args) {
  auto p = cli::Subprocess::Spawn(args, {"TENSORHUB_LOG=warn"});
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return std::move(p).value();
}

std::string Ask(cli::Subprocess& p, const std::string& cmd,
                int64_t timeout_ms) {
  Status s = p.Send(cmd);
  if (!s.ok()) return "error " + s.ToString();
  auto line = p.ReadLine(Deadline::AfterMs(timeout_ms));
  return line.ok() ? *line : "error " + line.status().ToString();
}

int RoleOrTestsMain(int argc, char** argv,
                    int (*run_role)(int argc, char** argv)) {
  int rc = run_role(argc, argv);
  if (rc >= 0) return rc;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

}  // namespace tensorhub::testing
