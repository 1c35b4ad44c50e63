#include "remote/auth.h"

#include <grpc/support/log.h>

#include <chrono>
#include <map>
#include <mutex>

#include "common/json_document.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace ts::remote {
namespace {

// gRPC reports a file that is not PEM only as a failed listen or an empty address list.
Result<std::string> readPem(const std::string& path, const std::string& what, const char* marker)
{
    TS_ASSIGN(std::string pem, readTextFile(path, what));
    const bool key = std::string(marker).find("PRIVATE KEY") != std::string::npos;
    if (pem.find("-----BEGIN ") == std::string::npos || pem.find(marker) == std::string::npos)
        return makeError(ErrorCode::InvalidArgument, path + " is not a PEM " + what + " (no \"-----BEGIN ..." + marker + "\" block)",
                         key ? "pass the PEM private key (openssl pkey -in ... -inform DER -out key.pem converts a DER one)"
                             : "pass the PEM file (openssl x509 -in ... -inform DER -out cert.pem converts a DER one)");
    return pem;
}

std::string trim(std::string s)
{
    const char* ws = " \t\r\n";
    const auto b = s.find_first_not_of(ws);
    if (b == std::string::npos) return {};
    return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// No early exit on the first differing byte, so timing does not reveal a prefix of the token.
bool constantTimeEquals(const std::string& a, const std::string& b)
{
    unsigned char diff = a.size() == b.size() ? 0 : 1;
    const std::size_t n = std::max(a.size(), b.size());
    for (std::size_t i = 0; i < n; ++i) {
        const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
        const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
        diff |= static_cast<unsigned char>(x ^ y);
    }
    return diff == 0;
}

} // namespace

Result<std::string> loadToken(const std::string& file)
{
    std::string token;
    std::string from;
    if (!file.empty()) {
        TS_ASSIGN(token, readTextFile(file, "token file"));
        from = "token file " + file;
    } else if (const char* env = std::getenv(kTokenEnv)) {
        token = env;
        from = std::string("$") + kTokenEnv;
    } else {
        return makeError(ErrorCode::InvalidArgument, "no shared token: neither --token-file nor $" + std::string(kTokenEnv) + " is set",
                         "put the cluster's shared secret in a file (chmod 600) and pass --token-file, or export " + std::string(kTokenEnv));
    }
    token = trim(token);
    const bool env = file.empty();
    if (token.empty())
        return makeError(ErrorCode::InvalidArgument, from + " is empty" + (env ? " (set, but to nothing)" : ""),
                         env ? "export " + std::string(kTokenEnv) + "=<the cluster's shared secret> on every task, or pass --token-file"
                             : "write the cluster's shared secret into " + file + " (the same on every task)");
    // The token travels as an HTTP/2 header value, which gRPC only takes in printable ASCII: any
    // other byte made every call abort the process ("Illegal header value") instead of failing.
    for (std::size_t i = 0; i < token.size(); ++i) {
        const auto c = static_cast<unsigned char>(token[i]);
        if (c >= 0x20 && c <= 0x7e) continue;
        char code[8];
        std::snprintf(code, sizeof code, "0x%02x", c);
        const std::string what = c == '\n' || c == '\r' ? "a line break (the token is one line)"
                                 : c < 0x20 || c == 0x7f ? std::string("a control character (") + code + ")"
                                                         : std::string("not ASCII (") + code + ")";
        return makeError(ErrorCode::InvalidArgument, from + ": character " + std::to_string(i + 1) + " of the token is " + what,
                         "a token is one line of printable ASCII, e.g. the output of `openssl rand -hex 32`");
    }
    return token;
}

void attachToken(grpc::ClientContext& context, const std::string& token)
{
    context.AddMetadata("authorization", "Bearer " + token);
}

grpc::Status checkToken(const grpc::ServerContext& context, const std::string& token, const char* call)
{
    const auto& md = context.client_metadata();
    auto it = md.find("authorization");
    const std::string got = it == md.end() ? std::string() : std::string(it->second.data(), it->second.size());
    if (!token.empty() && constantTimeEquals(got, "Bearer " + token)) return grpc::Status::OK;
    logLine(std::string("refused ") + call + " from " + context.peer() + ": " + (it == md.end() ? "no token" : "wrong token"));
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or wrong token");
}

std::string elapsedText(double seconds)
{
    const long s = std::lround(seconds);
    return s < 120 ? std::to_string(s) + " s" : s < 7200 ? std::to_string(s / 60) + " min" : std::to_string(s / 3600) + " h";
}

void logLine(const std::string& line)
{
    std::fprintf(stderr, "[trainstudio] %s\n", line.c_str());
    std::fflush(stderr);
}

namespace {

void grpcLog(gpr_log_func_args* args)
{
    // Errors only (gRPC's default verbosity): a bind failure, a refused TLS handshake. A client
    // that keeps retrying repeats the same line several times a second: say it once per 10 s.
    if (args->severity != GPR_LOG_SEVERITY_ERROR || !args->message) return;
    static std::mutex mutex;
    static std::map<std::string, std::pair<std::chrono::steady_clock::time_point, int>> recent;  // message -> last said, held back since
    const std::string message = args->message;
    const auto now = std::chrono::steady_clock::now();
    std::string line;
    {
        std::lock_guard lock(mutex);
        if (recent.size() > 64) recent.clear();
        auto it = recent.find(message);
        if (it != recent.end() && now - it->second.first < std::chrono::seconds(10)) {
            ++it->second.second;
            return;
        }
        const int held = it == recent.end() ? 0 : it->second.second;
        recent[message] = {now, 0};
        line = "grpc: " + message + (held > 0 ? " (and " + std::to_string(held) + " more time(s) before)" : "");
    }
    logLine(line);
}

// The text after the last "NAME: " marker gRPC put before its reason, e.g. "...: Connection refused".
std::string tail(const std::string& message, const std::string& after)
{
    const auto at = message.rfind(after);
    return at == std::string::npos ? message : message.substr(at + after.size());
}

// OpenSSL's reason at the end of gRPC's handshake message: "certificate verify failed".
std::string reason(const std::string& message)
{
    std::string r = tail(message, "routines:");
    while (!r.empty() && (r.front() == ':' || r.front() == ' ')) r.erase(r.begin());
    return r;
}

std::string hostOf(const std::string& address)
{
    // [v6]:port, host:port
    if (!address.empty() && address.front() == '[') return address.substr(1, address.find(']') - 1);
    const auto colon = address.rfind(':');
    return colon == std::string::npos ? address : address.substr(0, colon);
}

} // namespace

void routeGrpcLogs()
{
    static std::once_flag once;
    std::call_once(once, [] { gpr_set_log_function(&grpcLog); });
}

Error troubleError(const ConnectTrouble& trouble, const std::string& prefix)
{
    return makeError(trouble.patienceSeconds == 0 ? ErrorCode::InvalidArgument : ErrorCode::IoError, prefix + ": " + trouble.what,
                     trouble.hint);
}

std::string callFailure(const grpc::Status& status)
{
    if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && status.error_message() == "Deadline Exceeded")
        return "no answer in time (a stopped or overloaded machine?)";
    return status.error_message();
}

std::optional<ConnectTrouble> connectTrouble(const grpc::Status& status, const std::string& address, bool tls)
{
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return std::nullopt;
    const std::string& m = status.error_message();
    auto has = [&](const char* text) { return m.find(text) != std::string::npos; };
    ConnectTrouble t;
    if (has("DNS resolution failed")) {
        t.what = "host name '" + hostOf(address) + "' does not resolve (DNS: " + tail(m, ": ") + ")";
        t.hint = "check the host name in the cluster (TF_CONFIG's \"cluster\", or --cluster's file) and this machine's DNS";
    } else if (has("Connection refused")) {
        t.what = "nothing listens at " + address + " (connection refused)";
        t.hint = "start it, or check the port in the cluster";
    } else if (has("wrong version number") || (has("Ssl handshake failed") && has("WRONG_VERSION"))) {
        t.what = address + " does not speak TLS, but this side connected with a CA (--tls-ca)";
        t.hint = "give every worker daemon --tls-cert and --tls-key, or use no TLS anywhere (drop --tls-ca)";
        t.patienceSeconds = 0;
    } else if (has("certificate verify failed") || has("CERTIFICATE_VERIFY_FAILED")) {
        t.what = "the certificate served at " + address + " is not signed by the CA this side trusts (" + reason(m) + ")";
        t.hint = "pass the CA that signed every worker's --tls-cert as --tls-ca, on the coordinator and on every worker daemon";
        t.patienceSeconds = 0;
    } else if (has("is not in peer certificate") || has("Peer name")) {
        t.what = "the certificate served at " + address + " does not name '" + hostOf(address) + "' (" + tail(m, ": ") + ")";
        t.hint = "issue each worker's certificate for the host name or IP the cluster uses for it (subjectAltName)";
        t.patienceSeconds = 0;
    } else if (has("Ssl handshake failed") || has("Handshake failed")) {
        t.what = "the TLS handshake with " + address + " failed (" + (has("routines:") ? reason(m) : tail(m, ": ")) + ")";
        t.hint = "check --tls-cert, --tls-key and --tls-ca on both sides";
        t.patienceSeconds = 0;
    } else if (has("Socket closed") && !tls) {
        // A TLS server closes a plain connection when its first bytes are not a TLS hello.
        t.what = address + " closed the connection at once: it may serve TLS while this side speaks plain gRPC";
        t.hint = "if the worker daemons serve TLS (--tls-cert), the coordinator and every daemon need --tls-ca (the CA that "
                 "signed their certificates): tasks connect to each other with it";
        t.patienceSeconds = 5;
    } else if (has("failed to connect to all addresses")) {
        // gRPC's whole text: this catch-all has hidden odd causes ("No such file or directory"
        // from a daemon already listening), which only its detail can tell apart.
        t.what = "cannot connect to " + address + " (gRPC: " + m + ")";
        t.hint = "is it running, and reachable from this machine (firewall, address)?";
    } else {
        return std::nullopt;
    }
    return t;
}

Result<std::shared_ptr<grpc::ServerCredentials>> serverCredentials(const TlsFiles& tls)
{
    routeGrpcLogs();  // every server and channel is made with these credentials
    if (tls.certificate.empty() && tls.privateKey.empty()) return grpc::InsecureServerCredentials();
    if (tls.certificate.empty() || tls.privateKey.empty())
        return makeError(ErrorCode::InvalidArgument, "TLS needs both a certificate and a private key", "pass --tls-cert and --tls-key together");
    TS_ASSIGN(std::string cert, readPem(tls.certificate, "TLS certificate", "CERTIFICATE-----"));
    TS_ASSIGN(std::string key, readPem(tls.privateKey, "TLS private key", "PRIVATE KEY-----"));
    grpc::SslServerCredentialsOptions opts;
    opts.pem_key_cert_pairs.push_back({key, cert});
    return grpc::SslServerCredentials(opts);
}

Result<std::shared_ptr<grpc::ChannelCredentials>> channelCredentials(const TlsFiles& tls)
{
    routeGrpcLogs();
    if (tls.rootCa.empty()) return grpc::InsecureChannelCredentials();
    TS_ASSIGN(std::string ca, readPem(tls.rootCa, "TLS CA certificate", "CERTIFICATE-----"));
    grpc::SslCredentialsOptions opts;
    opts.pem_root_certs = ca;
    return grpc::SslCredentials(opts);
}

grpc::ChannelArguments channelArguments(int maxReceiveBytes, std::chrono::milliseconds maxBackoff)
{
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(maxReceiveBytes);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, static_cast<int>(maxBackoff.count()));
    // Despite its name, the shortest time a connect attempt is given (gRPC's default is 20 s).
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 10000);
    return args;
}

} // namespace ts::remote
