#include "core/thread_name.h"

#include <pthread.h>

#include <cstring>

#include "zinf/device.h"

namespace zinf {

bool& TransferCounters::IsWorkerThread() {
  // Initial-exec: the flag lives in static TLS, read without a __tls_get_addr call, also
  // where libzinf is dlopened (the Python module). Dynamic TLS in a dlopened library is also
  // what LeakSanitizer's thread scan misreads (Note [Bindings under the leak checker]).
  [[gnu::tls_model("initial-exec")]] static thread_local bool worker = false;
  return worker;
}

void NameThisThread(const char* name) {
  char cut[16] = {};  // pthread_setname_np refuses names over 15 characters
  std::strncpy(cut, name, sizeof(cut) - 1);
  pthread_setname_np(pthread_self(), cut);
}

}  // namespace zinf
