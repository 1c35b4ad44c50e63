#include "remote/auth.h"

#include "common/json_document.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace ts::remote {
namespace {

// gRPC reports a file that is not PEM only as a failed listen or an empty address list.
Result<std::string> readPem(const std::string& path, const std::string& what, const char* marker)
{
    TS_ASSIGN(std::string pem, readTextFile(path, what));
    if (pem.find("-----BEGIN ") == std::string::npos || pem.find(marker) == std::string::npos)
        return makeError(ErrorCode::InvalidArgument, path + " is not a PEM " + what + " (no \"-----BEGIN ..." + marker + "\" block)",
                         "pass the PEM file (openssl x509 -in ... -outform PEM converts a DER one)");
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
    if (token.empty()) return makeError(ErrorCode::InvalidArgument, from + " is empty", "write the shared secret into it");
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

void logLine(const std::string& line)
{
    std::fprintf(stderr, "[trainstudio] %s\n", line.c_str());
    std::fflush(stderr);
}

Result<std::shared_ptr<grpc::ServerCredentials>> serverCredentials(const TlsFiles& tls)
{
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
    if (tls.rootCa.empty()) return grpc::InsecureChannelCredentials();
    TS_ASSIGN(std::string ca, readPem(tls.rootCa, "TLS CA certificate", "CERTIFICATE-----"));
    grpc::SslCredentialsOptions opts;
    opts.pem_root_certs = ca;
    return grpc::SslCredentials(opts);
}

} // namespace ts::remote
