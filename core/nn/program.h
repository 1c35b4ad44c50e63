#pragma once
// Program: a validated graph (model/GraphAnalysis) compiled for one replica on one Backend —
// parameters, gradients, activation buffers and the forward/backward schedule.
// Contract:
//  - Threading: a Program is driven by one thread (its replica's); several Programs may share
//    one parameter arena (Mirrored over host devices) but each has its own gradients and
//    activations. Whoever shares parameters must not update them while a forward runs.
//  - Memory: all buffers come from the backend's allocator; parameters and gradients each live
//    in one contiguous arena (64-byte aligned slots), so a Communicator reduces one buffer and an
//    Optimizer updates one buffer.
//  - Errors: create() reports graphs it cannot run; forward/backward only fail on backend errors.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/spec.h"

namespace ts {

struct ParamSlot {
    std::string name;   // "<layer id>/<param>", e.g. "dense/kernel" (Keras naming)
    int node = -1;      // index in GraphAnalysis::nodes
    ParamSpec spec;
    int64_t offset = 0; // element offset in its arena
    Tensor value;       // view into the trainable or non-trainable arena
    Tensor grad;        // view into the gradient arena (trainable only)
};

struct LossSpec {
    LossKind kind = LossKind::SparseCategoricalCrossentropy;
    bool fromLogits = false;
};
Result<LossSpec> parseLoss(const std::string& name, bool fromLogits);
// Keras' name of the loss ("sparse_categorical_crossentropy", ...).
const char* lossName(LossKind kind);
// Whether the labels `y` (a batch, host) are targets the loss can read for a model output of
// `outputShape` per example: one i32 class id (sparse), f32 rows of the output's size, or, for a
// one-value output and a loss other than categorical_crossentropy, class ids (read as floats).
Status checkLossTargets(LossKind loss, const Shape& outputShape, const Tensor& y);

class Program {
public:
    // `shared`: another Program on a host-accessible backend whose parameter arenas this one
    // uses too (Mirrored over logical CPU devices). Null: own parameters (zero-initialised).
    static Result<std::unique_ptr<Program>> create(std::shared_ptr<const GraphAnalysis> graph,
                                                   Backend& backend, const LossSpec& loss,
                                                   Program* shared = nullptr);
    ~Program();

    Backend& backend() { return m_backend; }
    const GraphAnalysis& graph() const { return *m_graph; }

    // Forward pass on a batch (host tensor: (N, ...input shape)). `seed` drives dropout.
    Status forward(const Tensor& x, bool training, uint64_t seed);
    // Loss of the last forward against y (host tensor, I32 (N) or F32 (N, C)); writes the mean
    // loss over this batch and the number of correct predictions. If `backward`, also computes
    // gradients (overwriting the gradient arena) scaled so that summing over replicas gives
    // the gradient of the mean loss over `globalBatch` rows, times `lossScale` (mixed_float16's
    // loss scaling: the caller divides it out of the reduced gradients; `loss` is unscaled).
    Status lossAndBackward(const Tensor& y, bool backward, int64_t globalBatch, float* loss,
                           int64_t* correct, float lossScale = 1.0f);
    // Model outputs of the last forward as a host tensor (probabilities where the final softmax
    // or sigmoid was folded into the loss).
    Result<Tensor> outputs();

    const std::vector<ParamSlot>& params() const { return m_slots; }
    Tensor trainableArena() const { return m_trainable; }
    Tensor nonTrainableArena() const { return m_nonTrainable; }
    Tensor gradientArena() const { return m_gradients; }
    // The gradients followed by kGradientTail spare floats, so that one all-reduce over it can
    // also carry a few per-step sums (multi-worker: the step's loss and accuracy counts) instead
    // of a second round trip.
    static constexpr int64_t kGradientTail = 4;
    Tensor gradientArenaWithTail() const { return m_gradientsWithTail; }
    int64_t trainableCount() const { return m_trainable.defined() ? m_trainable.numel() : 0; }
    bool foldedOutputActivation() const { return m_fold; }

    // Glorot-uniform kernels, zero biases, BN gamma=1 / moving_variance=1 (Keras defaults),
    // drawn from `seed` in slot order; independent of the backend.
    Status initialiseParameters(uint64_t seed);
    // Host copies for checkpoints / weight files (Keras layouts).
    Result<std::vector<std::pair<std::string, Tensor>>> exportParameters();
    // Loads named host tensors; every parameter must be present with the right shape unless
    // `partial`; unknown names are errors (they usually mean a different model).
    Status importParameters(const std::vector<std::pair<std::string, Tensor>>& tensors,
                            const std::string& source, bool partial = false);

private:
    struct Impl;
    Program(std::shared_ptr<const GraphAnalysis> graph, Backend& backend);
    Status build(const LossSpec& loss, Program* shared);
    Status ensureCapacity(int64_t n);

    std::shared_ptr<const GraphAnalysis> m_graph;
    Backend& m_backend;
    std::unique_ptr<Impl> m_d;
    std::vector<ParamSlot> m_slots;
    Tensor m_trainable, m_nonTrainable, m_gradients;
    Tensor m_gradientsWithTail;  // m_gradients is its first trainableCount() elements
    bool m_fold = false;
};

} // namespace ts
