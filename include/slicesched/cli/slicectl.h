// slicectl: the command-line client of the `sliced` daemon.
//
//   slicectl [GLOBAL FLAGS] COMMAND [ARGS]
//
// tools/slicectl.cc only forwards argv to RunSlicectl(); everything else
// lives here so tests can run commands in-process against a daemon on a unix
// socket and capture what they print. Run `slicectl --help` for the commands
// and flags (kSlicectlHelpText below).
//
// Output: aligned tables for people; with --json, JSON (protobuf's JSON
// mapping of the response, field names as in the .proto files; `generate`
// prints one JSON object per token, one per line). `timeline` always writes
// a Chrome trace (JSON).
//
// Exit codes (SlicectlExit): 0 ok; 1 the server answered with an error
// (printed as "slicectl: CODE_NAME: message", e.g. UNIMPLEMENTED); 2 usage
// error (bad command line, unreadable input file); 3 cannot connect (no
// socket, nothing listening, TLS handshake failed).
#pragma once

#include <grpcpp/grpcpp.h>

#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "slicesched/v1/gmg.pb.h"

namespace slicesched {

enum SlicectlExit : int { kSlicectlOk = 0, kSlicectlServerError = 1, kSlicectlUsage = 2, kSlicectlCannotConnect = 3 };

extern const char kSlicectlHelpText[];

// Runs one command line (`args` excludes argv[0]); writes results to `out`
// and diagnostics to `err`; returns the exit code.
int RunSlicectl(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// --- Formatting (pure; exposed for tests) ------------------------------------

// Columns padded to their widest cell, separated by two spaces; the header
// row (when not empty) is upper-case as given. No trailing spaces.
std::string FormatTable(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows);

// Graphviz DOT of a GMG dump: one cluster per instance, one node per GMG node
// (label: op, device, state), edges from predecessors.
std::string GmgDumpToDot(const v1::GmgDump& dump);

// `submit FILE`: a relative `dataset.path` in a job file is relative to the
// file (docs/operations.md), but the daemon has no directory to resolve it
// against, so slicectl makes it absolute from `file_dir` (absolute) before
// sending the YAML. Only that scalar changes, on its own line, so the
// daemon's LINE:COL positions stay those of the file. Text that does not
// parse, has no such path or an absolute one is returned unchanged (the
// daemon reports what is wrong).
std::string AnchorJobDatasetPath(const std::string& yaml, const std::string& file_dir);

// "OK", "UNIMPLEMENTED", ... (the gRPC status code names).
std::string_view GrpcCodeName(grpc::StatusCode code);

// 1536 -> "1.5 KiB"; 0 -> "0 B".
std::string HumanBytes(int64_t bytes);

}  // namespace slicesched
