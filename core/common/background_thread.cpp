#include "common/background_thread.h"

#include <cstdlib>

#ifdef __linux__
#include <pthread.h>
#include <sched.h>
#endif

namespace ts {

void becomeBackgroundThread(const char* name)
{
#ifdef __linux__
    pthread_setname_np(pthread_self(), name);
#endif
    // For A/B measurements of the policy itself.
    static const bool off = std::getenv("TS_FOREGROUND_HELPERS") != nullptr;
    if (off) return;
#ifdef __linux__
    sched_param param{};
    param.sched_priority = 0;
    pthread_setschedparam(pthread_self(), SCHED_BATCH, &param);
#endif
}

} // namespace ts
