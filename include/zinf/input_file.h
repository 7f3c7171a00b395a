// Reading input files that zinf does not trust: configs, profiles, manifests, metrics, weights
// headers. Every reader in the library, the tools, the examples and the bindings goes through
// these two calls, so that no input can grow memory without bound (`/dev/zero`, a FIFO, a
// file that keeps growing) or crash a parser by nesting (Note [Bounded input] in
// src/core/input_file.cc).
//
//   ZINF_ASSIGN_OR_RETURN(std::string text, ReadInputFile(path, "--config"));
//   ZINF_RETURN_IF_ERROR(CheckJsonDepth(text, path));
//   ... then parse `text`.
//
// Thread-safety: both functions are reentrant.
#ifndef ZINF_INPUT_FILE_H_
#define ZINF_INPUT_FILE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "zinf/export.h"
#include "zinf/status.h"

namespace zinf {

// The default cap on an input file: far above any config, profile or manifest, far below
// what would hurt a trainer's memory.
inline constexpr uint64_t kMaxInputFileBytes = uint64_t{64} << 20;

// Deepest nesting of JSON arrays and objects zinf parses. nlohmann's parser is iterative, but
// copying, destroying and dumping a value recurse: 100k levels overflow the stack. Real
// configs, manifests and safetensors headers nest fewer than 10 levels.
inline constexpr int kMaxJsonDepth = 128;

// Reads the whole of `path`, which must be a regular file of at most `max_bytes`, or "-" for
// standard input (an explicit stream, read up to the same cap). `what` names the input in
// errors ("--config", "checkpoint manifest"). Errors: the open's errno as a Status (ErrnoStatus,
// with the path), InvalidArgument for a directory, device or FIFO, and
// ResourceExhausted naming the size and the cap for a larger input. Never allocates more
// than max_bytes + 1 bytes of text.
ZINF_EXPORT StatusOr<std::string> ReadInputFile(const std::string& path, std::string_view what,
                                                uint64_t max_bytes = kMaxInputFileBytes);

// InvalidArgument, naming `source` and the byte offset, when `text` nests arrays and objects
// deeper than `max_depth`; scans brackets outside strings without parsing, so it is safe on
// any bytes. OK for text that is not JSON (the parser then reports it).
ZINF_EXPORT Status CheckJsonDepth(std::string_view text, std::string_view source,
                                  int max_depth = kMaxJsonDepth);

}  // namespace zinf

#endif  // ZINF_INPUT_FILE_H_
