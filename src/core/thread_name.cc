#include "core/thread_name.h"

#include <pthread.h>

#include <cstring>

namespace zinf {

void NameThisThread(const char* name) {
#if defined(__linux__)
  char cut[16] = {};
  std::strncpy(cut, name, sizeof(cut) - 1);
  pthread_setname_np(pthread_self(), cut);
#else
  (void)name;
#endif
}

}  // namespace zinf
