/* ZINF_EXPORT: marks the declarations that libzinf.so exports.
 *
 * zinf's libraries are compiled with hidden visibility, so that only the public API (the C ABI
 * in zinf/c_api.h and the C++ classes and functions in include/zinf/) is visible to programs
 * that link libzinf.so, and the private layers can change without breaking them. Every public
 * declaration carries this macro; on a compiler without visibility attributes it is empty.
 *
 * This header is C and C++ (zinf/c_api.h includes it). Thread-safety: not applicable. */
#ifndef ZINF_EXPORT_H_
#define ZINF_EXPORT_H_

#if (defined(__GNUC__) || defined(__clang__)) && defined(__cplusplus) && __cplusplus >= 201103L
/* The standard attribute form, which may follow [[nodiscard]] in a class head. */
#define ZINF_EXPORT [[gnu::visibility("default")]]
#elif defined(__GNUC__) || defined(__clang__)
#define ZINF_EXPORT __attribute__((visibility("default")))
#else
#define ZINF_EXPORT
#endif

#endif /* ZINF_EXPORT_H_ */
