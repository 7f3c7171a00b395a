// Names the calling thread (private; not part of the public API): zinf's helper threads show as
// "zinf-..." in top -H, perf and /proc/PID/task/*/comm, so their CPU time can be told apart from
// the trainer's. thread_name.cc also holds the flag that marks a thread as one of zinf's own
// (TransferCounters::MarkWorkerThread, zinf/device.h).
#ifndef ZINF_CORE_THREAD_NAME_H_
#define ZINF_CORE_THREAD_NAME_H_

namespace zinf {

// At most 15 characters (Linux's limit); longer names are cut.
void NameThisThread(const char* name);

}  // namespace zinf

#endif  // ZINF_CORE_THREAD_NAME_H_
