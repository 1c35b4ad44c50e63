#pragma once
// A TCP socket listening on a free loopback port, for tests that need something other than our
// services at an address (a web server, a machine that accepts and never answers).

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace tstest {

struct LoopbackListener {
    int fd = -1;
    int port = 0;  // 0: it could not listen
    LoopbackListener()
    {
        fd = ::socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0) return;
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof addr;
        if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 && ::listen(fd, 8) == 0 &&
            ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
            port = ntohs(addr.sin_port);
    }
    ~LoopbackListener()
    {
        if (fd >= 0) ::close(fd);
    }
    LoopbackListener(const LoopbackListener&) = delete;
    LoopbackListener& operator=(const LoopbackListener&) = delete;
    // A thread blocked in accept() returns (join it before the listener goes).
    void stopAccepting()
    {
        if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
    }
};

} // namespace tstest
