#include "etcd_process.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "common/deadline.h"
#include "ha/etcd_client.h"
#include "subprocess.h"

extern char** environ;

namespace tensorhub::lab {
namespace {

// The last `bytes` of a file (etcd's log, for an error message).
std::string Tail(const std::string& path, size_t bytes) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return "";
  std::fseek(f, 0, SEEK_END);
  long size = std::ftell(f);
  std::fseek(f, size > static_cast<long>(bytes) ? size - bytes : 0, SEEK_SET);
  std::string out(bytes, '\0');
  out.resize(std::fread(out.data(), 1, out.size(), f));
  std::fclose(f);
  return out;
}

}  // namespace

Result<std::string> FindEtcd() {
  if (const char* env = std::getenv("TENSORHUB_ETCD"); env && *env) {
    if (::access(env, X_OK) == 0) return std::string(env);
    return NotFound(std::string("$TENSORHUB_ETCD (") + env +
                    ") is not an executable");
  }
  if (const char* path = std::getenv("PATH")) {
    std::string p = path;
    size_t pos = 0;
    while (pos <= p.size()) {
      size_t colon = p.find(':', pos);
      if (colon == std::string::npos) colon = p.size();
      std::string candidate = p.substr(pos, colon - pos) + "/etcd";
      if (colon > pos && ::access(candidate.c_str(), X_OK) == 0)
        return candidate;
      pos = colon + 1;
    }
  }
  if (::access("/usr/bin/etcd", X_OK) == 0) return std::string("/usr/bin/etcd");
  return NotFound(
      "etcd is not installed: `apt-get install etcd-server` (Debian's etcd "
      "3.4; scripts/install-deps.sh does it), or set $TENSORHUB_ETCD");
}

Result<std::unique_ptr<EtcdProcess>> EtcdProcess::Start() {
  TH_ASSIGN_OR_RETURN(std::string bin, FindEtcd());
  TH_ASSIGN_OR_RETURN(int client_port, cli::FreeLoopbackPort());
  TH_ASSIGN_OR_RETURN(int peer_port, cli::FreeLoopbackPort());
  std::string tmpl =
      (std::filesystem::temp_directory_path() / "tensorhub-etcd-XXXXXX")
          .string();
  if (::mkdtemp(tmpl.data()) == nullptr) {
    return Internal(std::string("mkdtemp: ") + std::strerror(errno));
  }
  std::unique_ptr<EtcdProcess> e(new EtcdProcess());
  e->dir_ = tmpl;
  e->endpoint_ = "127.0.0.1:" + std::to_string(client_port);
  const std::string client_url = "http://" + e->endpoint_;
  const std::string peer_url = "http://127.0.0.1:" + std::to_string(peer_port);
  std::vector<std::string> args = {
      bin,
      "--name=th",
      "--data-dir=" + e->dir_ + "/data",
      "--listen-client-urls=" + client_url,
      "--advertise-client-urls=" + client_url,
      "--listen-peer-urls=" + peer_url,
      "--initial-advertise-peer-urls=" + peer_url,
      "--initial-cluster=th=" + peer_url,
      "--initial-cluster-state=new",
  };
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // Its log goes to a file beside the data (kept only while it runs).
  const std::string log = e->dir_ + "/etcd.log";
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return Internal(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    // The child: only async-signal-safe calls until exec. It dies with
    // this process (a crashed test leaves no etcd behind).
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int in = ::open("/dev/null", O_RDONLY);
    if (out < 0 || in < 0) ::_exit(127);
    ::dup2(in, STDIN_FILENO);
    ::dup2(out, STDOUT_FILENO);
    ::dup2(out, STDERR_FILENO);
    ::execve(bin.c_str(), argv.data(), environ);
    ::_exit(127);
  }
  e->pid_ = pid;
  TH_ASSIGN_OR_RETURN(std::unique_ptr<ha::EtcdClient> client,
                      ha::EtcdClient::Create(e->endpoint_));
  const Deadline deadline = Deadline::AfterMs(30000);
  Status last;
  while (!deadline.expired()) {
    int wstatus = 0;
    if (::waitpid(e->pid_, &wstatus, WNOHANG) == e->pid_) {
      e->pid_ = -1;
      return Unavailable("etcd exited at start (a port taken?): " +
                         Tail(log, 2000));
    }
    Result<ha::RangeResult> r =
        client->Range("/", "", 1, 0, deadline.Cap(1000));
    if (r.ok()) return e;
    last = r.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return Unavailable("etcd did not answer within 30 s: " + last.ToString() +
                     "; its log ends: " + Tail(log, 2000));
}

EtcdProcess::~EtcdProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int wstatus = 0;
    ::waitpid(pid_, &wstatus, 0);
  }
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
}

}  // namespace tensorhub::lab
