#include "core/thread_name.h"

#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>

namespace zinf {
namespace {

// What top -H and perf show for the calling thread.
std::string ThisThreadsComm() {
  std::ifstream in("/proc/self/task/" + std::to_string(syscall(SYS_gettid)) + "/comm");
  std::string name;
  std::getline(in, name);
  return name;
}

TEST(NameThisThread, ShowsInProcAndCutsLongNames) {
  std::string named, cut;
  std::thread([&] {
    NameThisThread("zinf-test");
    named = ThisThreadsComm();
    NameThisThread("zinf-a-name-longer-than-fifteen");
    cut = ThisThreadsComm();
  }).join();
  EXPECT_EQ(named, "zinf-test");
  EXPECT_EQ(cut, "zinf-a-name-lon");
}

}  // namespace
}  // namespace zinf
