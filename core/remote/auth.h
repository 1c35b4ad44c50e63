#pragma once
// Shared-token authentication for every TrainStudio gRPC service (rendezvous, worker control,
// parameter server).
// The token travels as "authorization: Bearer <token>" metadata; servers compare it in constant
// time and refuse (and log) calls without it. TLS, when configured, protects it on the wire.
// Contract: free functions, thread-safe; loadToken returns errors naming the file or variable.

#include <chrono>
#include <memory>
#include <optional>
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

// "12 s", "5 min", "3 h": how long ago something began, in the services' messages.
std::string elapsedText(double seconds);

// Where refusals and server-side problems are logged (stderr with a "[trainstudio]" prefix).
void logLine(const std::string& line);
// Sends gRPC's own log lines (bind failures, TLS handshakes a server refused) through logLine as
// "grpc: ...", without gRPC's timestamp/thread/file prefix. Idempotent; serverCredentials and
// channelCredentials call it, so every process that makes a server or a channel has it.
void routeGrpcLogs();

// Why a call could not reach `address`, in words a user can act on, read from gRPC's UNAVAILABLE
// status: a host name that does not resolve, nothing listening, a TLS mismatch. `tls`: this side
// connected with a CA (--tls-ca). Empty for other statuses.
struct ConnectTrouble {
    std::string what;  // "host name 'h0' does not resolve (DNS: Domain name not found)"
    std::string hint;
    // How long waiting may help: 0, not at all (a TLS mismatch, a certificate from another CA);
    // -1, as long as the caller waits anyway (nothing listens yet, a name DNS does not know yet:
    // the peer may start later); N > 0, while it lasts under N seconds (a connection closed at
    // once, which a restarting server also does, but a TLS server does every time).
    int patienceSeconds = -1;
};
std::optional<ConnectTrouble> connectTrouble(const grpc::Status& status, const std::string& address, bool tls);
// "<prefix>: <what>" with its hint; InvalidArgument when waiting cannot help, else IoError.
Error troubleError(const ConnectTrouble& trouble, const std::string& prefix);
// A failed call's reason for a message: gRPC's own, except its bare "Deadline Exceeded", which
// reads as what it means between our processes (our services' own deadline texts stay).
std::string callFailure(const grpc::Status& status);

// TLS: credentials from PEM files; empty paths give insecure (loopback/testing) credentials.
struct TlsFiles {
    std::string certificate;  // server: its certificate chain; client: unused
    std::string privateKey;   // server only
    std::string rootCa;       // client: CA to verify the server with; server: unused
};
Result<std::shared_ptr<grpc::ServerCredentials>> serverCredentials(const TlsFiles& tls);
Result<std::shared_ptr<grpc::ChannelCredentials>> channelCredentials(const TlsFiles& tls);

// Arguments for every channel between our processes: replies up to maxReceiveBytes, and a peer
// that was down (not started yet, restarted, dropped) is tried again within maxBackoff instead of
// gRPC's default of up to two minutes, during which every call fails at once with the last
// connect error. A connect attempt itself may take 10 s (a TLS handshake over a slow link).
grpc::ChannelArguments channelArguments(int maxReceiveBytes, std::chrono::milliseconds maxBackoff = std::chrono::milliseconds(1000));

} // namespace ts::remote
