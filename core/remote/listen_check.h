#pragma once
// Checks that an address can be listened on before gRPC takes it: gRPC reports a failed bind
// only as a log line and a server that did not start. Contract: a free function, thread-safe;
// the error names the address and says what to do. Port 0 (any free port) always passes.

#include <string>

#include "common/result.h"

namespace ts::remote {

// `what`: who wanted the address, for the message ("trainstudio-worker", "chief:0's rendezvous").
Status checkCanListen(const std::string& address, const std::string& what);

} // namespace ts::remote
