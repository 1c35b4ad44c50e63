#pragma once
// Shared-token authentication for every TrainStudio gRPC service (rendezvous, worker control,
// parameter server).
// The token travels as "authorization: Bearer <token>" metadata; servers compare it in constant
// time and refuse (and log) calls without it. TLS, when configured, protects it on the wire.
// Contract: free functions, thread-safe; loadToken returns errors naming the file or variable.

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "common/result.h"

namespace ts::remote {

inline constexpr const char* kTokenEnv = "TRAINSTUDIO_TOKEN";

// The token from `file` if given (surrounding whitespace trimmed), else from $TRAINSTUDIO_TOKEN.
// An empty token is an error: every call must be authenticated.
Result<std::string> loadToken(const std::string& file);

void attachToken(grpc::ClientContext& context, const std::string& token);
// OK, or UNAUTHENTICATED (logged with the peer's address and `call`).
grpc::Status checkToken(const grpc::ServerContext& context, const std::string& token, const char* call);

// Where refusals and server-side problems are logged (stderr with a "[trainstudio]" prefix).
void logLine(const std::string& line);

// TLS: credentials from PEM files; empty paths give insecure (loopback/testing) credentials.
struct TlsFiles {
    std::string certificate;  // server: its certificate chain; client: unused
    std::string privateKey;   // server only
    std::string rootCa;       // client: CA to verify the server with; server: unused
};
Result<std::shared_ptr<grpc::ServerCredentials>> serverCredentials(const TlsFiles& tls);
Result<std::shared_ptr<grpc::ChannelCredentials>> channelCredentials(const TlsFiles& tls);

} // namespace ts::remote
