#include "core/thread_name.h"

#include <pthread.h>

#include <cstring>

namespace zinf {

void NameThisThread(const char* name) {
  char cut[16] = {};  // pthread_setname_np refuses names over 15 characters
  std::strncpy(cut, name, sizeof(cut) - 1);
  pthread_setname_np(pthread_self(), cut);
}

}  // namespace zinf
