#pragma once
// NcclCommunicator: ts::Communicator over NCCL for replicas on CUDA devices, in one process
// (Mirrored over local GPUs) or across the processes of a multi-worker run (one NCCL
// communicator spanning every process's GPUs; NCCL picks NVLink, PCIe or the network).
// Contract (in addition to communicator.h's):
//  - Threading: local replica r calls with rank r from its own thread (the replica threads of
//    the strategy); abort() from any thread.
//  - Tensors: F32 device tensors on the rank's own device (all-reduce, barrier); broadcast takes
//    any dtype. Work is queued on the device's one stream (cuda_device.h), so it is ordered after
//    the kernels that produced the gradients; a call returns once the stream has finished it.
//  - Connection: process 0 makes NCCL's unique id and broadcasts it over the group's
//    cross-process communicator (Gloo, which met through the coordinator's rendezvous); every
//    process takes part in that broadcast even when process 0 failed, so none waits for it.
//  - Faults: communicators are non-blocking (NCCL's config.blocking = 0) and every wait polls:
//    a peer's failure reported by NCCL, abort(), or a collective that the stream has reached but
//    that has not completed within the group's timeout fails the call with an error naming the
//    device and what was pending, and aborts this rank's NCCL communicator, so no thread hangs in
//    NCCL. After a failure every later call fails. Destruction finalizes the healthy
//    communicators together and aborts the others.
//  - The calling thread's current CUDA device is left as it was (construction runs on replica
//    0's thread, already bound to its device).
//  - Ownership: owns its NCCL communicators, one float of scratch per device (barrier) and one
//    event per device (where the timeout starts).

#include <memory>

#include "backend/registry.h"
#include "common/result.h"
#include "distribute/communicator.h"

namespace ts::cuda {

Result<std::unique_ptr<Communicator>> makeNcclCommunicator(const CollectiveGroup& group);

} // namespace ts::cuda
