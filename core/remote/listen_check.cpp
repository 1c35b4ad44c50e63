#include "remote/listen_check.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "distribute/cluster_spec.h"

namespace ts::remote {

Status checkCanListen(const std::string& address, const std::string& what)
{
    TS_ASSIGN(HostPort hp, HostPort::parse(address, true));
    if (hp.port == 0) return okStatus();
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* found = nullptr;
    const std::string port = std::to_string(hp.port);
    if (const int rc = ::getaddrinfo(hp.host.c_str(), port.c_str(), &hints, &found); rc != 0)
        return makeError(ErrorCode::InvalidArgument, what + " cannot listen on " + address + ": '" + hp.host + "' does not resolve (" + ::gai_strerror(rc) + ")",
                         "use one of this machine's addresses or host names");
    int err = 0;
    for (addrinfo* a = found; a; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        const int one = 1;
        ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // as gRPC does: a socket in TIME_WAIT is no obstacle
        const int rc = ::bind(fd, a->ai_addr, a->ai_addrlen);
        err = rc == 0 ? 0 : errno;
        ::close(fd);
        if (err == 0) break;
    }
    ::freeaddrinfo(found);
    if (err == 0) return okStatus();
    const std::string where = what + " cannot listen on " + address + ": ";
    switch (err) {
    case EADDRINUSE:
        return makeError(ErrorCode::IoError, where + "port " + port + " is in use by another program",
                         "stop it (`ss -ltnp 'sport = :" + port + "'` names it; another trainstudio-worker or task?) or use another port");
    case EADDRNOTAVAIL:
        return makeError(ErrorCode::InvalidArgument, where + hp.host + " is not an address of this machine",
                         "listen on one of this machine's addresses (`ip -brief address`), or check the host in the cluster");
    case EACCES:
        return makeError(ErrorCode::InvalidArgument, where + "ports below 1024 need privileges", "use a port from 1024 up");
    default:
        return makeError(ErrorCode::IoError, where + std::strerror(err), "check the address");
    }
}

} // namespace ts::remote
