// Runs the ranks of a multi-process test as forked children and collects how they ended.
#ifndef ZINF_TESTS_TESTING_FORK_RANKS_H_
#define ZINF_TESTS_TESTING_FORK_RANKS_H_

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>

namespace zinf::testing {

// Forks one child per rank in [0, world) except `absent` ones; each runs body(rank) and exits
// with its return value without running destructors (state forked from the parent, such as a
// server's threads, must not be torn down twice). Returns each started rank's exit code, or
// 128 + signal when it was killed, in rank order.
inline std::vector<int> ForkRanks(int world, const std::function<int(int rank)>& body,
                                  const std::vector<int>& absent = {}) {
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; ++rank) {
    if (std::find(absent.begin(), absent.end(), rank) != absent.end()) continue;
    const pid_t pid = fork();
    if (pid == 0) {
      const int code = body(rank);
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  return codes;
}

// `n` distinct loopback TCP ports that were free a moment ago, for the ranks' rendezvous: one
// per engine a test makes in turn, since a port just closed may still be in use, and the next
// port up may be another test's. Plain sockets, all bound at once so that they differ, so that
// the caller stays free of threads until it forks.
inline std::vector<int> FreePorts(int n) {
  std::vector<int> fds, ports;
  for (int i = 0; i < n; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    int port = 29555 + i;
    if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port = ntohs(addr.sin_port);
    }
    if (fd >= 0) fds.push_back(fd);
    ports.push_back(port);
  }
  for (int fd : fds) close(fd);
  return ports;
}

inline int FreePort() { return FreePorts(1)[0]; }

// ForkRanks of body(rank, port): `world` ranks that rendezvous on one FreePort. Returns their
// exit codes in rank order.
inline std::vector<int> RunRanks(int world, const std::function<int(int rank, int port)>& body) {
  const int port = FreePort();
  return ForkRanks(world, [&](int rank) { return body(rank, port); });
}

}  // namespace zinf::testing

#endif  // ZINF_TESTS_TESTING_FORK_RANKS_H_
