#include "core/thread_name.h"

#include <pthread.h>

#include <cstring>

#include "zinf/device.h"

namespace zinf {

namespace {
// A pthread key, not thread_local: libzinf is dlopened by the Python module, where
// initial-exec TLS fails to load beside torch ("cannot allocate memory in static TLS block") and
// GCC 12's LeakSanitizer misreads dynamic TLS (Note [Bindings under the leak checker]).
pthread_key_t WorkerKey() {
  static const pthread_key_t key = [] {
    pthread_key_t k;
    pthread_key_create(&k, nullptr);
    return k;
  }();
  return key;
}
}  // namespace

void TransferCounters::MarkWorkerThread() {
  static int marked = 1;
  pthread_setspecific(WorkerKey(), &marked);
}

bool TransferCounters::IsWorkerThread() { return pthread_getspecific(WorkerKey()) != nullptr; }

void NameThisThread(const char* name) {
  char cut[16] = {};  // pthread_setname_np refuses names over 15 characters
  std::strncpy(cut, name, sizeof(cut) - 1);
  pthread_setname_np(pthread_self(), cut);
}

}  // namespace zinf
