#include "common/allocator_tuning.h"

#include <malloc.h>

#include <cstdlib>
#include <cstring>

namespace ts {

bool keepLargeBuffersInHeap()
{
    const char* tunables = std::getenv("GLIBC_TUNABLES");
    if ((tunables && std::strstr(tunables, "malloc")) || std::getenv("MALLOC_MMAP_THRESHOLD_") || std::getenv("MALLOC_TRIM_THRESHOLD_"))
        return false;
    // Both are needed: a fixed mmap threshold alone also fixes the trim threshold at its 128 KiB
    // default, and the heap is then trimmed after nearly every free (measured: twice as slow).
    return mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1 && mallopt(M_TRIM_THRESHOLD, 256 << 20) == 1;
}

} // namespace ts
