// `zinf run`: environment, output prefixes, what happens when a rank fails, and that ranks
// die with the launcher however it ends.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/temp_dir.h"
#include "tests/tools/run_zinf.h"

namespace {

using namespace std::chrono_literals;
using zinf::testing::RunZinf;
using zinf::testing::ZinfRun;

// True while `pid` exists and is not a zombie (an orphan's reaper may be slow).
bool Alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string pid_field, comm, state;
  if (!(stat >> pid_field >> comm >> state)) return false;
  return state != "Z" && state != "X";
}

// A launcher started in the background: `zinf run -n ranks ARGS -- sh -c SCRIPT`, whose ranks
// write their pid to files in a scratch directory and then run SCRIPT (where @DIR@ is that
// directory).
class BackgroundRun {
 public:
  BackgroundRun(int ranks, const std::string& launcher_args, const std::string& script) {
    ranks_ = ranks;
    std::string script_here = script;
    for (size_t at; (at = script_here.find("@DIR@")) != std::string::npos;) {
      script_here.replace(at, 5, dir_);
    }
    const std::string rank_script = "echo $$ > " + dir_ + "/pid.$RANK.tmp && mv " + dir_ +
                                    "/pid.$RANK.tmp " + dir_ + "/pid.$RANK; " + script_here;
    std::vector<std::string> argv = {ZINF_BINARY, "run", "-n", std::to_string(ranks)};
    for (size_t start = 0, end; start < launcher_args.size(); start = end + 1) {
      end = launcher_args.find(' ', start);
      if (end == std::string::npos) end = launcher_args.size();
      if (end > start) argv.push_back(launcher_args.substr(start, end - start));
    }
    for (const char* a : {"--", "sh", "-c"}) argv.push_back(a);
    argv.push_back(rank_script);
    launcher_ = fork();
    if (launcher_ == 0) {
      const int null = open("/dev/null", O_WRONLY);
      dup2(null, STDOUT_FILENO);
      dup2(null, STDERR_FILENO);
      std::vector<char*> args;
      for (std::string& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
  }
  ~BackgroundRun() {
    for (pid_t pid : rank_pids_) kill(pid, SIGKILL);
    for (pid_t pid : descendants_) kill(pid, SIGKILL);
    if (launcher_ > 0 && !reaped_) {
      kill(launcher_, SIGKILL);
      waitpid(launcher_, nullptr, 0);
    }
  }

  // Waits until every rank has written its pid; false after 10 s.
  bool WaitForRanks() { return WaitForPids("pid", &rank_pids_); }

  // Waits for the pids the ranks' scripts wrote to @DIR@/NAME.$RANK (processes they started),
  // which the destructor kills too; false after 10 s.
  bool WaitForPids(const std::string& name, std::vector<pid_t>* pids) {
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < deadline) {
      pids->clear();
      for (int r = 0; r < ranks_; ++r) {
        std::ifstream in(dir_ + "/" + name + "." + std::to_string(r));
        pid_t pid = 0;
        if (in >> pid) pids->push_back(pid);
      }
      if (static_cast<int>(pids->size()) == ranks_) {
        if (pids != &rank_pids_)
          descendants_.insert(descendants_.end(), pids->begin(), pids->end());
        return true;
      }
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }

  pid_t launcher() const { return launcher_; }

  // Signals the launcher (0: none) and reaps it; returns its wait status.
  int SignalLauncher(int sig) {
    if (sig != 0) kill(launcher_, sig);
    int status = 0;
    waitpid(launcher_, &status, 0);
    reaped_ = true;
    return status;
  }

  // True when no rank, and no process the ranks' scripts reported, is alive within `limit`.
  bool RanksGoneWithin(std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    for (;;) {
      bool any = false;
      for (pid_t pid : rank_pids_) any = any || Alive(pid);
      for (pid_t pid : descendants_) any = any || Alive(pid);
      if (!any) return true;
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(20ms);
    }
  }

 private:
  // Removed after the processes are killed: members go after the destructor's body.
  const zinf::testing::TempDir tmp_{"zinf-run-test", "/tmp"};
  const std::string& dir_ = tmp_.path();
  int ranks_ = 0;
  pid_t launcher_ = -1;
  bool reaped_ = false;
  std::vector<pid_t> rank_pids_;
  std::vector<pid_t> descendants_;
};

// Ranks that ignore SIGTERM and SIGHUP (a disposition exec keeps) and would train for a minute.
constexpr char kStubbornRank[] = "trap '' TERM HUP; exec sleep 60";

TEST(ZinfRunTest, RanksDieWhenTheLauncherIsKilled) {
  BackgroundRun run(2, "--grace 30", kStubbornRank);
  ASSERT_TRUE(run.WaitForRanks());
  const int status = run.SignalLauncher(SIGKILL);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_TRUE(run.RanksGoneWithin(5s)) << "ranks outlived their launcher";
}

// A rank that is a shell running the trainer, which ignores SIGTERM too: the trainer is the
// rank's child, out of PR_SET_PDEATHSIG's reach.
constexpr char kStubbornTrainerUnderAShell[] =
    "trap '' TERM HUP; sleep 60 & echo $! > @DIR@/child.$RANK; wait";

TEST(ZinfRunTest, EveryDescendantDiesWithinASecondOfKillNine) {
  BackgroundRun run(2, "--grace 30", kStubbornTrainerUnderAShell);
  ASSERT_TRUE(run.WaitForRanks());
  std::vector<pid_t> trainers;
  ASSERT_TRUE(run.WaitForPids("child", &trainers));
  run.SignalLauncher(SIGKILL);
  EXPECT_TRUE(run.RanksGoneWithin(1s)) << "a rank's child outlived kill -9 of the launcher";
}

TEST(ZinfRunTest, EveryDescendantDiesOnTermAndHangup) {
  for (int sig : {SIGTERM, SIGHUP}) {
    BackgroundRun run(2, "--grace 30", "sleep 60 & echo $! > @DIR@/child.$RANK; wait");
    ASSERT_TRUE(run.WaitForRanks());
    std::vector<pid_t> trainers;
    ASSERT_TRUE(run.WaitForPids("child", &trainers));
    run.SignalLauncher(sig);
    EXPECT_TRUE(run.RanksGoneWithin(1s)) << strsignal(sig);
  }
}

TEST(ZinfRunTest, ARanksDeathEndsTheOtherRanksDescendants) {
  // Each rank's shell starts a trainer that ignores SIGTERM; rank 1's shell then fails,
  // leaving its trainer orphaned. Both trainers must go: rank 0's by the grace's SIGKILL of
  // its group, rank 1's although its rank has already exited.
  BackgroundRun run(2, "--grace 0.5",
                    "trap '' TERM; sleep 60 & echo $! > @DIR@/child.$RANK; "
                    "if [ $RANK = 0 ]; then wait; fi; "
                    "while [ ! -s @DIR@/child.0 ]; do sleep 0.05; done; exit 3");
  ASSERT_TRUE(run.WaitForRanks());
  std::vector<pid_t> trainers;
  ASSERT_TRUE(run.WaitForPids("child", &trainers));
  const auto t0 = std::chrono::steady_clock::now();
  const int status = run.SignalLauncher(0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 3) << status;
  EXPECT_TRUE(run.RanksGoneWithin(1s));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

// The launcher's CPU time in clock ticks (utime + stime from /proc/PID/stat).
long CpuTicks(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return -1;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stol(field);
    if (i == 15) stime = std::stol(field);
  }
  return utime + stime;
}

TEST(ZinfRunTest, NoBusyLoopOnceEveryRankClosesItsOutput) {
  BackgroundRun run(2, "", "exec > /dev/null 2>&1; exec sleep 60");
  ASSERT_TRUE(run.WaitForRanks());
  std::this_thread::sleep_for(300ms);  // the launcher has seen both outputs close
  const long before = CpuTicks(run.launcher());
  std::this_thread::sleep_for(3s);
  const long used = CpuTicks(run.launcher()) - before;
  ASSERT_GE(before, 0);
  // Under 1% of 3 s; a busy loop uses all of it.
  EXPECT_LT(static_cast<double>(used) / sysconf(_SC_CLK_TCK), 0.03) << used << " ticks";
}

TEST(ZinfRunTest, HangupStopsTheRanksLikeTerm) {
  BackgroundRun polite(2, "", "exec sleep 60");
  ASSERT_TRUE(polite.WaitForRanks());
  const auto t0 = std::chrono::steady_clock::now();
  int status = polite.SignalLauncher(SIGHUP);
  ASSERT_TRUE(WIFEXITED(status)) << "the launcher handles SIGHUP instead of dying of it";
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGHUP);
  EXPECT_TRUE(polite.RanksGoneWithin(1s));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  // Ranks that ignore the request are killed after --grace.
  BackgroundRun stubborn(2, "--grace 1", kStubbornRank);
  ASSERT_TRUE(stubborn.WaitForRanks());
  status = stubborn.SignalLauncher(SIGHUP);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGHUP);
  EXPECT_TRUE(stubborn.RanksGoneWithin(1s));
}

TEST(ZinfRunTest, RanksShareAFreshStoreSecret) {
  unsetenv("ZINF_STORE_SECRET");
  ZinfRun a = RunZinf("run -n 2 -- sh -c 'echo secret=$ZINF_STORE_SECRET'");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const size_t at0 = a.output.find("[rank 0] secret=");
  const size_t at1 = a.output.find("[rank 1] secret=");
  ASSERT_NE(at0, std::string::npos) << a.output;
  ASSERT_NE(at1, std::string::npos) << a.output;
  const std::string s0 = a.output.substr(at0 + 16, a.output.find('\n', at0) - at0 - 16);
  const std::string s1 = a.output.substr(at1 + 16, a.output.find('\n', at1) - at1 - 16);
  EXPECT_EQ(s0.size(), 64u) << "32 random bytes in hex: '" << s0 << "'";
  EXPECT_EQ(s0.find_first_not_of("0123456789abcdef"), std::string::npos) << s0;
  EXPECT_EQ(s0, s1) << "every rank of a job gets the same secret";
  ZinfRun b = RunZinf("run -n 1 -- sh -c 'echo secret=$ZINF_STORE_SECRET'");
  EXPECT_EQ(b.output.find(s0), std::string::npos) << "each job gets its own secret";
  // One given to the launcher (multi-node jobs need the same on every node) is passed on.
  setenv("ZINF_STORE_SECRET", "shared-by-all-nodes", 1);
  ZinfRun c = RunZinf(
      "run -n 1 --nnodes 2 --node-rank 1 --master 10.0.0.1:29500 -- "
      "sh -c 'echo secret=$ZINF_STORE_SECRET'");
  unsetenv("ZINF_STORE_SECRET");
  EXPECT_EQ(c.exit_code, 0) << c.output;
  EXPECT_NE(c.output.find("[rank 1] secret=shared-by-all-nodes"), std::string::npos) << c.output;
  ZinfRun d = RunZinf("run -n 1 --nnodes 2 --master 10.0.0.1:29500 -- true");
  EXPECT_EQ(d.exit_code, 2) << d.output;
  EXPECT_NE(d.output.find("needs ZINF_STORE_SECRET"), std::string::npos) << d.output;
}

TEST(ZinfRunTest, GraceOutOfRangeIsNamed) {
  for (const char* grace : {"1e300", "-1", "nan", "inf"}) {
    ZinfRun r = RunZinf(std::string("run --grace ") + grace + " -- true");
    EXPECT_EQ(r.exit_code, 2) << grace << ": " << r.output;
    EXPECT_NE(r.output.find("--grace must be in [0, 86400] seconds, got"), std::string::npos)
        << r.output;
  }
  ZinfRun big = RunZinf("run --grace 1e300 -- true");
  EXPECT_NE(big.output.find("got 1e+300"), std::string::npos) << big.output;
  EXPECT_EQ(RunZinf("run --grace 0.5 -- true").exit_code, 0);
}

TEST(ZinfRunTest, SetsTorchrunEnvironmentAndPrefixesOutput) {
  ZinfRun r = RunZinf(
      "run -n 3 -- sh -c 'echo env $RANK/$WORLD_SIZE/$LOCAL_RANK/$LOCAL_WORLD_SIZE/$MASTER_ADDR; "
      "echo to-stderr >&2; printf no-newline'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string p = "[rank " + std::to_string(rank) + "] ";
    EXPECT_NE(r.output.find(p + "env " + std::to_string(rank) + "/3/" + std::to_string(rank) +
                            "/3/127.0.0.1"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find(p + "to-stderr"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(p + "no-newline"), std::string::npos) << "partial lines are kept";
  }
}

TEST(ZinfRunTest, NodeRankOffsetsGlobalRanks) {
  ZinfRun r = RunZinf(
      "run -n 2 --nnodes 2 --node-rank 1 --master 127.0.0.1:29999 -- "
      "sh -c 'echo $RANK $LOCAL_RANK $WORLD_SIZE $MASTER_PORT'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 2] 2 0 4 29999"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 3] 3 1 4 29999"), std::string::npos) << r.output;
}

TEST(ZinfRunTest, AFailingRankStopsTheOthers) {
  const auto t0 = std::chrono::steady_clock::now();
  ZinfRun r = RunZinf("run -n 3 --grace 2 -- sh -c 'if [ $RANK = 1 ]; then exit 3; fi; sleep 60'");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("rank 1 exited with code 3"), std::string::npos) << r.output;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20))
      << "the sleeping ranks must be stopped, not waited for";
}

TEST(ZinfRunTest, ACrashIsNamed) {
  ZinfRun r = RunZinf("run -n 2 -- sh -c 'if [ $RANK = 0 ]; then kill -SEGV $$; fi'");
  EXPECT_EQ(r.exit_code, 128 + 11) << r.output;
  EXPECT_NE(r.output.find("rank 0 was killed by signal 11"), std::string::npos) << r.output;
}

TEST(ZinfRunTest, BadInvocations) {
  ZinfRun missing = RunZinf("run -n 2 -- /nonexistent/trainer --flag");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("cannot run '/nonexistent/trainer'"), std::string::npos)
      << missing.output;
  EXPECT_NE(RunZinf("run -n 0 -- true").exit_code, 0);
  EXPECT_NE(RunZinf("run -n 2").exit_code, 0);
  ZinfRun no_master = RunZinf("run -n 1 --nnodes 2 -- true");
  EXPECT_NE(no_master.exit_code, 0);
  EXPECT_NE(no_master.output.find("--master ADDR:PORT is required"), std::string::npos);
  EXPECT_NE(RunZinf("run -n 1 --master nocolon -- true").exit_code, 0);
}

}  // namespace
