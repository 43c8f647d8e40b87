// Names of error codes (see status.h).
#include "core/status.h"

namespace kiln {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kInvalidFile: return "invalid file";
    case ErrorCode::kNotFound: return "not found";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kOutOfRange: return "out of range";
    case ErrorCode::kOutOfMemory: return "out of memory";
    case ErrorCode::kIo: return "i/o error";
    case ErrorCode::kCancelled: return "cancelled";
    case ErrorCode::kInternal: return "internal error";
  }
  return "error";
}

}  // namespace kiln
