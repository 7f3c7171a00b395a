// Mutex, MutexLock and CondVar: std::mutex and std::condition_variable with clang's
// thread-safety annotations (core/thread_annotations.h), as LevelDB's port::Mutex and
// util/mutexlock.h. A class says what its Mutex guards with ZINF_GUARDED_BY, and the functions
// that need it held with ZINF_REQUIRES; clang builds check both.
//
// A function that holds the mutex may let go of it around slow work (mu.Unlock(); ...;
// mu.Lock()), also while a MutexLock holds it, as long as it holds it again on return. A
// condition is waited for in a loop, `while (!ready) cv.Wait(&mu);`, not with a predicate
// lambda: the analysis cannot see that a lambda runs with the mutex held.
//
// Thread-safety: as std::mutex and std::condition_variable.
#ifndef ZINF_CORE_MUTEX_H_
#define ZINF_CORE_MUTEX_H_

#include <condition_variable>
#include <mutex>

#include "core/thread_annotations.h"

namespace zinf {

class ZINF_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ZINF_ACQUIRE() { mu_.lock(); }
  void Unlock() ZINF_RELEASE() { mu_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` from construction to destruction.
class ZINF_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ZINF_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ZINF_RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // Lets go of `mu` until woken (or spuriously), then holds it again.
  void Wait(Mutex* mu) ZINF_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // still held: the caller's
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace zinf

#endif  // ZINF_CORE_MUTEX_H_
