// `zinf run -n N [--nnodes M --node-rank R --master ADDR:PORT] -- CMD ARGS...`: starts N
// local ranks of CMD with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), prefixes every output line with its rank,
// forwards SIGINT and SIGTERM, and when a rank fails stops the others and exits non-zero
// naming the rank and how it ended.
#include <fcntl.h>
#include <fmt/core.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/tcp_store.h"
#include "tools/commands.h"

namespace zinf::tools {
namespace {

struct RunArgs {
  int nproc = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master;  // ADDR:PORT; empty: 127.0.0.1 and a free port (one node only)
  double grace_s = 5.0;
  std::vector<std::string> command;
};

volatile sig_atomic_t g_signal = 0;
void OnSignal(int sig) { g_signal = sig; }

struct Child {
  int rank = 0;
  pid_t pid = -1;
  int out_fd = -1;  // stdout and stderr of the child, merged per stream below
  int err_fd = -1;
  std::string out_partial, err_partial;
  bool exited = false;
  int status = 0;
};

std::string Describe(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status),
                       strsignal(WTERMSIG(status)));
  }
  return "ended";
}

// Writes complete lines from `data` with the rank prefix; keeps a partial last line.
void EmitLines(int rank, const char* data, size_t n, std::string* partial, FILE* sink) {
  partial->append(data, n);
  size_t start = 0;
  for (size_t nl; (nl = partial->find('\n', start)) != std::string::npos; start = nl + 1) {
    fmt::print(sink, "[rank {}] {}\n", rank, std::string_view(*partial).substr(start, nl - start));
  }
  partial->erase(0, start);
  std::fflush(sink);
}

void Drain(Child& c, int* fd, std::string* partial, FILE* sink) {
  char buffer[65536];
  for (;;) {
    const ssize_t n = read(*fd, buffer, sizeof(buffer));
    if (n > 0) {
      EmitLines(c.rank, buffer, static_cast<size_t>(n), partial, sink);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (!partial->empty()) EmitLines(c.rank, "\n", 1, partial, sink);
    close(*fd);
    *fd = -1;
    return;
  }
}

StatusOr<pid_t> Spawn(const RunArgs& args, const std::string& addr, int port, Child* child) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    return ErrnoStatus(errno, "creating pipes for a rank");
  }
  const pid_t pid = fork();
  if (pid < 0) return ErrnoStatus(errno, "fork");
  if (pid == 0) {
    // Its own process group: stopping a rank stops everything it started (a shell's
    // children would otherwise live on and hold the output pipes open).
    setpgid(0, 0);
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    const int world = args.nnodes * args.nproc;
    setenv("RANK", std::to_string(child->rank).c_str(), 1);
    setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
    setenv("LOCAL_RANK", std::to_string(child->rank % args.nproc).c_str(), 1);
    setenv("LOCAL_WORLD_SIZE", std::to_string(args.nproc).c_str(), 1);
    setenv("MASTER_ADDR", addr.c_str(), 1);
    setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    std::vector<char*> argv;
    for (const std::string& a : args.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    fmt::print(stderr, "cannot run '{}': {}\n", args.command[0], std::strerror(errno));
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);
  child->out_fd = out[0];
  child->err_fd = err[0];
  return pid;
}

void SignalAll(std::vector<Child>& children, int sig) {
  for (Child& c : children) {
    if (c.pid > 0) kill(-c.pid, sig);  // the rank's whole process group
  }
}

int Run(const RunArgs& args) {
  if (args.command.empty()) {
    fmt::print(stderr, "zinf run: no command given (zinf run -n N -- CMD ARGS...)\n");
    return 2;
  }
  if (args.node_rank < 0 || args.node_rank >= args.nnodes) {
    fmt::print(stderr, "zinf run: --node-rank must be in [0, {}), got {}\n", args.nnodes,
               args.node_rank);
    return 2;
  }
  std::string addr = "127.0.0.1";
  int port = 0;
  if (!args.master.empty()) {
    const size_t colon = args.master.rfind(':');
    port = colon == std::string::npos ? 0 : std::atoi(args.master.c_str() + colon + 1);
    if (colon == std::string::npos || port <= 0 || port > 65535) {
      fmt::print(stderr, "zinf run: --master must be ADDR:PORT with a port in 1..65535, got '{}'\n",
                 args.master);
      return 2;
    }
    addr = args.master.substr(0, colon);
  } else if (args.nnodes > 1) {
    fmt::print(stderr, "zinf run: --master ADDR:PORT is required with --nnodes > 1\n");
    return 2;
  } else {
    // One node: a port that is free now, so that concurrent jobs do not collide on 29500.
    auto probe = TcpStore::Create(
        {.port = 0, .is_server = true, .timeout = std::chrono::milliseconds(1000)});
    port = probe.ok() ? (*probe)->port() : 29500;
  }

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  std::vector<Child> children(args.nproc);
  for (int i = 0; i < args.nproc; ++i) {
    children[i].rank = args.node_rank * args.nproc + i;
    StatusOr<pid_t> pid = Spawn(args, addr, port, &children[i]);
    if (!pid.ok()) {
      fmt::print(stderr, "zinf run: {}\n", pid.status().ToString());
      SignalAll(children, SIGTERM);
      return 1;
    }
    children[i].pid = *pid;
  }

  int exit_code = 0;
  std::optional<std::chrono::steady_clock::time_point> kill_deadline;
  std::optional<std::chrono::steady_clock::time_point> all_exited_at;
  int forwarded = 0;
  for (;;) {
    std::vector<pollfd> fds;
    for (Child& c : children) {
      if (c.out_fd >= 0) fds.push_back({c.out_fd, POLLIN, 0});
      if (c.err_fd >= 0) fds.push_back({c.err_fd, POLLIN, 0});
    }
    if (!fds.empty()) poll(fds.data(), fds.size(), 100);
    for (Child& c : children) {
      if (c.out_fd >= 0) Drain(c, &c.out_fd, &c.out_partial, stdout);
      if (c.err_fd >= 0) Drain(c, &c.err_fd, &c.err_partial, stderr);
    }
    if (g_signal != 0 && forwarded != g_signal) {
      forwarded = g_signal;
      fmt::print(stderr, "zinf run: forwarding {} to the ranks\n", strsignal(g_signal));
      SignalAll(children, g_signal);
      if (exit_code == 0) exit_code = 128 + g_signal;
      kill_deadline = std::chrono::steady_clock::now() +
                      std::chrono::milliseconds(static_cast<int>(args.grace_s * 1000));
    }
    bool all_done = true;
    for (Child& c : children) {
      if (c.exited) continue;
      int status = 0;
      const pid_t r = waitpid(c.pid, &status, WNOHANG);
      if (r == 0) {
        all_done = false;
        continue;
      }
      c.exited = true;
      c.status = status;
      const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      if (failed && exit_code == 0) {
        exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        fmt::print(stderr, "zinf run: rank {} {}; stopping the other ranks\n", c.rank,
                   Describe(status));
        SignalAll(children, SIGTERM);
        kill_deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int>(args.grace_s * 1000));
      }
    }
    if (all_done) {
      bool pipes_open = false;
      for (Child& c : children) pipes_open = pipes_open || c.out_fd >= 0 || c.err_fd >= 0;
      if (!all_exited_at) all_exited_at = std::chrono::steady_clock::now();
      // Something a rank left behind may hold a pipe open: do not wait on it for long.
      if (!pipes_open ||
          std::chrono::steady_clock::now() - *all_exited_at > std::chrono::seconds(2)) {
        break;
      }
    }
    if (kill_deadline && std::chrono::steady_clock::now() > *kill_deadline) {
      SignalAll(children, SIGKILL);
      kill_deadline.reset();
    }
  }
  if (exit_code != 0) {
    for (const Child& c : children) {
      if (!(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0)) {
        fmt::print(stderr, "zinf run: rank {} {}\n", c.rank, Describe(c.status));
      }
    }
  }
  return exit_code;
}

}  // namespace

void AddRunCommand(CLI::App& app) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* run = app.add_subcommand("run", "Start N ranks of a command (torchrun's environment)");
  run->add_option("-n,--nproc-per-node", args->nproc, "Ranks on this node")
      ->check(CLI::Range(1, 4096));
  run->add_option("--nnodes", args->nnodes, "Nodes in the job")->check(CLI::Range(1, 65536));
  run->add_option("--node-rank", args->node_rank, "This node's index");
  run->add_option("--master", args->master, "Rank 0's ADDR:PORT (default: 127.0.0.1, free port)");
  run->add_option("--grace", args->grace_s, "Seconds between SIGTERM and SIGKILL when stopping");
  run->add_option("command", args->command, "The command and its arguments, after --")->required();
  run->callback([args] { ExitCode() = Run(*args); });
}

}  // namespace zinf::tools
