// Clang's thread-safety annotations (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html),
// as LevelDB's port/thread_annotations.h: what a mutex guards, and what a function needs held,
// said in a form the compiler checks. Clang builds have -Wthread-safety on
// (cmake/ZinfHelpers.cmake); on other compilers the macros expand to nothing.
//
// The annotated mutex is core/mutex.h's Mutex: std::mutex carries no annotations in libstdc++.
//
// Thread-safety: macros only.
#ifndef ZINF_CORE_THREAD_ANNOTATIONS_H_
#define ZINF_CORE_THREAD_ANNOTATIONS_H_

#if defined(__clang__)
#define ZINF_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define ZINF_THREAD_ANNOTATION(x)
#endif

// A class whose objects are a capability (a mutex).
#define ZINF_CAPABILITY(x) ZINF_THREAD_ANNOTATION(capability(x))
// An RAII class that holds a capability for its lifetime.
#define ZINF_SCOPED_CAPABILITY ZINF_THREAD_ANNOTATION(scoped_lockable)
// A member read or written only with the mutex held.
#define ZINF_GUARDED_BY(x) ZINF_THREAD_ANNOTATION(guarded_by(x))
// A pointer member whose pointee is read or written only with the mutex held.
#define ZINF_PT_GUARDED_BY(x) ZINF_THREAD_ANNOTATION(pt_guarded_by(x))
// The caller holds the mutex (on entry and on return; the function may let go of it between).
#define ZINF_REQUIRES(...) ZINF_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
// The caller does not hold the mutex: the function takes it.
#define ZINF_EXCLUDES(...) ZINF_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// The function takes the mutex and returns holding it.
#define ZINF_ACQUIRE(...) ZINF_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
// The function lets go of a mutex the caller held.
#define ZINF_RELEASE(...) ZINF_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
// The function checks at run time that the mutex is held.
#define ZINF_ASSERT_CAPABILITY(x) ZINF_THREAD_ANNOTATION(assert_capability(x))
// The function returns a reference to this mutex.
#define ZINF_RETURN_CAPABILITY(x) ZINF_THREAD_ANNOTATION(lock_returned(x))
// Turns the analysis off for one function; say why beside it.
#define ZINF_NO_THREAD_SAFETY_ANALYSIS ZINF_THREAD_ANNOTATION(no_thread_safety_analysis)

#endif  // ZINF_CORE_THREAD_ANNOTATIONS_H_
