// `zinf run -n N [--nnodes M --node-rank R --master ADDR:PORT] -- CMD ARGS...`: starts N
// local ranks of CMD with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) plus ZINF_STORE_SECRET, prefixes every output
// line with its rank, forwards SIGINT and SIGTERM (and SIGHUP as SIGTERM), and when a rank
// fails stops the others and exits non-zero naming the rank and how it ended. Every process
// the ranks start dies with the launcher, however it ends (Note [The launcher's tree]).
//
// Note [The launcher's tree]
// A rank is often a shell or a wrapper around the trainer (`sh -c 'train_gpt ...; echo'`), so
// the launcher must own more than its direct children. Each rank runs in a process group of
// its own, and every signal the launcher sends goes to the whole group. PR_SET_PDEATHSIG kills
// only the direct child when the launcher dies, and kill -9 gives the launcher no chance to
// act, so a guardian process, forked first, holds the read end of a pipe whose write end
// only the launcher holds; it learns each rank's group as the rank starts. When the pipe
// closes (the launcher ended, however), the guardian kills every group it was given and
// exits: within milliseconds of kill -9, and at a normal end it takes whatever a rank left
// behind. A process that leaves its rank's group (setsid: a daemon) is outside this; so is
// a group whose every member is gone, which kill() then no longer finds.
#include <fcntl.h>
#include <fmt/core.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
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

// Longest --grace accepted: a day is more than any checkpoint-on-SIGTERM needs, and keeps
// the milliseconds well inside an int64.
constexpr double kMaxGraceS = 86400;

volatile sig_atomic_t g_signal = 0;
void OnSignal(int sig) { g_signal = sig; }

// fmt::print throws when the write fails; after SIGHUP the terminal may be gone, and the
// launcher must go on supervising the ranks regardless.
template <typename... Args>
void Say(FILE* sink, fmt::format_string<Args...> format, Args&&... args) {
  try {
    const std::string text = fmt::format(format, std::forward<Args>(args)...);
    std::fwrite(text.data(), 1, text.size(), sink);
  } catch (const std::exception&) {  // formatting ran out of memory: say nothing
  }
}

// 32 random bytes as hex: the job's TcpStore secret (See Note [TcpStore admission]).
StatusOr<std::string> NewStoreSecret() {
  uint8_t bytes[32];
  FILE* urandom = std::fopen("/dev/urandom", "rb");
  const bool read =
      urandom != nullptr && std::fread(bytes, 1, sizeof bytes, urandom) == sizeof bytes;
  if (urandom != nullptr) std::fclose(urandom);
  if (!read) {
    try {
      std::random_device device;  // getrandom() on Linux
      for (uint8_t& b : bytes) b = static_cast<uint8_t>(device());
    } catch (const std::exception& e) {
      return Unavailable(
          fmt::format("no randomness for {}: /dev/urandom and std::random_device "
                      "failed ({})",
                      kStoreSecretEnv, e.what()));
    }
  }
  std::string hex;
  for (uint8_t b : bytes) hex += fmt::format("{:02x}", b);
  return hex;
}

bool IsLoopback(const std::string& addr) {
  return addr.rfind("127.", 0) == 0 || addr == "::1" || addr == "localhost";
}

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
    Say(sink, "[rank {}] {}\n", rank, std::string_view(*partial).substr(start, nl - start));
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

// `secret` empty: the ranks inherit the launcher's ZINF_STORE_SECRET, if any.
StatusOr<pid_t> Spawn(const RunArgs& args, const std::string& addr, int port,
                      const std::string& secret, Child* child) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    return ErrnoStatus(errno, "creating pipes for a rank");
  }
  const pid_t launcher = getpid();
  const pid_t pid = fork();
  if (pid < 0) return ErrnoStatus(errno, "fork");
  if (pid == 0) {
    // A rank must not train on unsupervised when the launcher dies (kill -9, OOM killer):
    // the kernel kills it then. SIGKILL because nobody is left to escalate a SIGTERM that a
    // trainer ignores. The signal follows the thread that forked: this one, the launcher's
    // only thread. If the launcher died before prctl, no signal will come: exit now.
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != launcher) _exit(128 + SIGKILL);
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
    if (!secret.empty()) setenv(kStoreSecretEnv, secret.c_str(), 1);
    std::vector<char*> argv;
    for (const std::string& a : args.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    Say(stderr, "cannot run '{}': {}\n", args.command[0], std::strerror(errno));
    _exit(127);
  }
  // Also here, so that no signal to the group can come before the child's own setpgid.
  setpgid(pid, pid);
  close(out[1]);
  close(err[1]);
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);
  child->out_fd = out[0];
  child->err_fd = err[0];
  return pid;
}

// The guardian of Note [The launcher's tree]. Movable only through its owner, Run().
class Guardian {
 public:
  // Forks the guardian. Call before anything else is forked, with no threads running.
  static StatusOr<Guardian> Start() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return ErrnoStatus(errno, "creating the guardian's pipe");
    const pid_t pid = fork();
    if (pid < 0) return ErrnoStatus(errno, "forking the guardian");
    if (pid == 0) {
      close(fds[1]);
      Watch(fds[0]);  // never returns
    }
    close(fds[0]);
    return Guardian(fds[1]);
  }
  Guardian(Guardian&& o) noexcept : write_fd_(std::exchange(o.write_fd_, -1)) {}
  Guardian& operator=(Guardian&&) = delete;
  // Closing the pipe is the guardian's signal: it kills every group it holds.
  ~Guardian() {
    if (write_fd_ >= 0) close(write_fd_);
  }

  // Hands the guardian a rank's process group.
  void Add(pid_t group) {
    const int32_t id = group;
    while (write(write_fd_, &id, sizeof id) < 0 && errno == EINTR) {
    }
  }

 private:
  explicit Guardian(int write_fd) : write_fd_(write_fd) {}

  [[noreturn]] static void Watch(int read_fd) {
    prctl(PR_SET_NAME, "zinf-run-guard");
    // Signals meant for the launcher's terminal group (Ctrl-C, hang-up) are not for it.
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGQUIT}) signal(sig, SIG_IGN);
    // Holds nothing of the launcher's: its output pipes would otherwise stay open after it.
    const int null = open("/dev/null", O_RDWR);
    for (int fd : {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO}) dup2(null, fd);
    if (read_fd > 3) close_range(3, static_cast<unsigned>(read_fd) - 1, 0);
    close_range(static_cast<unsigned>(read_fd) + 1, ~0u, 0);
    std::vector<pid_t> groups;
    int32_t id = 0;
    for (;;) {
      const ssize_t n = read(read_fd, &id, sizeof id);
      if (n < 0 && errno == EINTR) continue;
      if (n != sizeof id) break;  // end of file: the launcher is gone
      groups.push_back(id);
    }
    for (pid_t group : groups) kill(-group, SIGKILL);
    _exit(0);
  }

  int write_fd_ = -1;
};

void SignalAll(std::vector<Child>& children, int sig) {
  for (Child& c : children) {
    if (c.pid > 0) kill(-c.pid, sig);  // the rank's whole process group
  }
}

int Run(const RunArgs& args) {
  if (args.command.empty()) {
    Say(stderr, "zinf run: no command given (zinf run -n N -- CMD ARGS...)\n");
    return 2;
  }
  // Checked before use: the grace becomes milliseconds in an integer.
  if (!(args.grace_s >= 0 && args.grace_s <= kMaxGraceS)) {
    Say(stderr, "zinf run: --grace must be in [0, {}] seconds, got {}\n", kMaxGraceS, args.grace_s);
    return 2;
  }
  const auto grace = std::chrono::milliseconds(static_cast<int64_t>(args.grace_s * 1000));
  if (args.node_rank < 0 || args.node_rank >= args.nnodes) {
    Say(stderr, "zinf run: --node-rank must be in [0, {}), got {}\n", args.nnodes, args.node_rank);
    return 2;
  }
  std::string addr = "127.0.0.1";
  int port = 0;
  if (!args.master.empty()) {
    const size_t colon = args.master.rfind(':');
    port = colon == std::string::npos ? 0 : std::atoi(args.master.c_str() + colon + 1);
    if (colon == std::string::npos || port <= 0 || port > 65535) {
      Say(stderr, "zinf run: --master must be ADDR:PORT with a port in 1..65535, got '{}'\n",
          args.master);
      return 2;
    }
    addr = args.master.substr(0, colon);
  } else if (args.nnodes > 1) {
    Say(stderr, "zinf run: --master ADDR:PORT is required with --nnodes > 1\n");
    return 2;
  } else {
    // One node: a port that is free now, so that concurrent jobs do not collide on 29500.
    auto probe = TcpStore::Create(
        {.port = 0, .is_server = true, .timeout = std::chrono::milliseconds(1000)});
    port = probe.ok() ? (*probe)->port() : 29500;
    // And a second for zinf's own store, MASTER_PORT being torch.distributed's (Note [Beside
    // torch.distributed]); both probes are open at once, so the two differ. The ranks inherit it.
    auto zinf_probe = TcpStore::Create(
        {.port = 0, .is_server = true, .timeout = std::chrono::milliseconds(1000)});
    if (probe.ok() && zinf_probe.ok() && std::getenv("ZINF_MASTER_PORT") == nullptr) {
      setenv("ZINF_MASTER_PORT", std::to_string((*zinf_probe)->port()).c_str(), 1);
    }
  }

  // The store's secret. Every node's launcher of a multi-node job must hand out the same one,
  // so there it comes from the environment; one node makes its own.
  std::string secret;
  const char* inherited = std::getenv(kStoreSecretEnv);
  if (inherited == nullptr || *inherited == '\0') {
    if (args.nnodes == 1) {
      StatusOr<std::string> made = NewStoreSecret();
      if (!made.ok()) {
        Say(stderr, "zinf run: {}\n", made.status().ToString());
        return 1;
      }
      secret = *std::move(made);
    } else if (!IsLoopback(addr)) {
      Say(stderr,
          "zinf run: --nnodes {} with --master {} needs {} set to the same random value on "
          "every node (e.g. from `openssl rand -hex 32`), so that only this job's ranks can "
          "use the rendezvous store\n",
          args.nnodes, args.master, kStoreSecretEnv);
      return 2;
    }
  }

  StatusOr<Guardian> guardian = Guardian::Start();
  if (!guardian.ok()) {
    Say(stderr, "zinf run: {}\n", guardian.status().ToString());
    return 1;
  }

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  // A closed terminal or a lost SSH session: stop the ranks as for SIGTERM, rather than die
  // and leave them to PR_SET_PDEATHSIG. Under nohup (SIGHUP ignored) it stays ignored.
  struct sigaction hup {};
  if (sigaction(SIGHUP, nullptr, &hup) == 0 && hup.sa_handler != SIG_IGN) {
    sigaction(SIGHUP, &sa, nullptr);
  }

  std::vector<Child> children(args.nproc);
  for (int i = 0; i < args.nproc; ++i) {
    children[i].rank = args.node_rank * args.nproc + i;
    StatusOr<pid_t> pid = Spawn(args, addr, port, secret, &children[i]);
    if (!pid.ok()) {
      Say(stderr, "zinf run: {}\n", pid.status().ToString());
      SignalAll(children, SIGTERM);
      return 1;
    }
    children[i].pid = *pid;
    guardian->Add(*pid);
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
    // Also with no outputs left (every rank redirected its own): a sleep, not a busy loop.
    poll(fds.data(), fds.size(), 100);
    for (Child& c : children) {
      if (c.out_fd >= 0) Drain(c, &c.out_fd, &c.out_partial, stdout);
      if (c.err_fd >= 0) Drain(c, &c.err_fd, &c.err_partial, stderr);
    }
    if (g_signal != 0 && forwarded != g_signal) {
      forwarded = g_signal;
      // SIGHUP is about the launcher's terminal, not the ranks' (they have none): they get
      // the ordinary request to stop.
      const int to_ranks = g_signal == SIGHUP ? SIGTERM : g_signal;
      Say(stderr, "zinf run: {}: sending {} to the ranks\n", strsignal(g_signal),
          strsignal(to_ranks));
      SignalAll(children, to_ranks);
      if (exit_code == 0) exit_code = 128 + g_signal;
      kill_deadline = std::chrono::steady_clock::now() + grace;
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
        Say(stderr, "zinf run: rank {} {}; stopping the other ranks\n", c.rank, Describe(status));
        SignalAll(children, SIGTERM);
        kill_deadline = std::chrono::steady_clock::now() + grace;
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
        Say(stderr, "zinf run: rank {} {}\n", c.rank, Describe(c.status));
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
  run->add_option("--grace", args->grace_s,
                  "Seconds between SIGTERM and SIGKILL when stopping, in [0, 86400]");
  run->add_option("command", args->command, "The command and its arguments, after --")->required();
  run->callback([args] { ExitCode() = Run(*args); });
}

}  // namespace zinf::tools
