#include "process_util.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <sstream>
#include <thread>
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

void StopProcess(pid_t pid) {
  ::kill(pid, SIGSTOP);
  std::string path = "/proc/" + std::to_string(pid) + "/stat";
  Deadline d = Deadline::AfterMs(5000);
  while (!d.expired()) {
    FILE* f = std::fopen(path.c_str(), "r");
    char state = '?';
    if (f != nullptr) {
      // "pid (comm) S ...": the state follows the last ')'.
      std::string line(512, '\0');
      size_t n = std::fread(line.data(), 1, line.size(), f);
      std::fclose(f);
      line.resize(n);
      size_t close = line.rfind(')');
      if (close != std::string::npos && close + 2 < line.size())
        state = line[close + 2];
    }
    if (state == 'T') return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ADD_FAILURE() << "process " << pid << " did not stop";
}

void FetchUntilPaused(cli::Subprocess& reader, const std::string& version,
                      int64_t timeout_ms, uint64_t pause_after,
                      int quiet_streams) {
  Status sent = reader.Send(
      "fetchx " + version + " " + std::to_string(timeout_ms) + " " +
      std::to_string(pause_after) + " " + std::to_string(quiet_streams));
  ASSERT_TRUE(sent.ok()) << sent.ToString();
  auto line = reader.ReadLine(Deadline::AfterMs(120000));
  ASSERT_TRUE(line.ok()) << line.status().ToString();
  ASSERT_EQ(Word(*line, 0), "paused") << *line;
  if (quiet_streams > 0) {
    ASSERT_EQ(Word(*line, 2), std::to_string(quiet_streams))
        << "not every stream waited between chunks: " << *line;
  }
}

std::string Resume(cli::Subprocess& reader) {
  Status s = reader.Send("go");
  if (!s.ok()) return "error " + s.ToString();
  auto line = reader.ReadLine(Deadline::AfterMs(120000));
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
