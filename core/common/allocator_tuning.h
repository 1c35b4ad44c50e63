#pragma once
// glibc malloc settings for processes that move large buffers every step (the worker daemon's
// gRPC calls carry a ps shard's values and gradients, hundreds of KB to MBs each).
// By default glibc maps such buffers fresh (or trims them back to the kernel when freed) and
// every step then page-faults them in again: on 2 cores that was half a parameter-server run's
// time. Keeping buffers up to 32 MiB in the heap and trimming only above 256 MiB of free top
// memory lets them be reused. A process calls this once, early, from main(); it leaves the
// settings alone when the user chose their own (GLIBC_TUNABLES with malloc, MALLOC_*_ variables).

namespace ts {

// Returns whether the settings were applied.
bool keepLargeBuffersInHeap();

} // namespace ts
