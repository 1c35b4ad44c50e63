#include "common/background_thread.h"

#include <cstdlib>

#ifdef __linux__
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace ts {

void becomeBackgroundThread(const char* name)
{
#ifdef __linux__
    pthread_setname_np(pthread_self(), name);
#endif
    // For A/B measurements of the policy itself.
    static const bool off = std::getenv("TS_FOREGROUND_HELPERS") != nullptr;
    static const bool nice0 = std::getenv("TS_HELPERS_NICE0") != nullptr;
    if (off) return;
#ifdef __linux__
    sched_param param{};
    param.sched_priority = 0;
    pthread_setschedparam(pthread_self(), SCHED_BATCH, &param);
    if (!nice0) setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 19);
#endif
}

} // namespace ts
