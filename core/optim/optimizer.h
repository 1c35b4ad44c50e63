#pragma once
// Optimizers (SGD with momentum/Nesterov, Adam, AdamW, RMSprop) over one flat parameter arena,
// and learning-rate schedules. Contract: prepare() once, then apply() for element ranges; calls
// on disjoint ranges may run concurrently (Mirrored replicas each update their share of a shared
// arena). State tensors live on the backend given to prepare(). Configs use Keras' names.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"

namespace ts {

class Optimizer {
public:
    virtual ~Optimizer() = default;
    // {"type": "adam"|"adamw"|"sgd"|"rmsprop", "learning_rate": ..., Keras keys ...}.
    // Unknown types/keys and out-of-range values are errors naming the key.
    static Result<std::unique_ptr<Optimizer>> create(const nlohmann::json& config);

    virtual std::string name() const = 0;
    float learningRate() const { return m_lr; }
    virtual nlohmann::json config() const = 0;

    // Allocates zeroed state for an arena of n elements.
    virtual Status prepare(Backend& backend, int64_t n) = 0;
    // One update of params[begin, end) from grads[begin, end) at learning rate lr; step is the
    // 1-based optimizer step (Adam's bias correction).
    virtual Status apply(Backend& backend, const Tensor& params, const Tensor& grads, int64_t begin,
                         int64_t end, float lr, int64_t step) = 0;
    // Named state tensors (for checkpoints), e.g. {"adam/m", t}.
    virtual std::vector<std::pair<std::string, Tensor>> state() const = 0;
    // Host copies of state(), for a training-state checkpoint. Adam's step count is not state:
    // apply() takes the global step, which the checkpoint records with the position.
    Result<std::vector<std::pair<std::string, Tensor>>> exportState(Backend& backend) const;
    // Loads what exportState wrote (the same optimizer over an arena of the same size). Every
    // state tensor must be present; errors name `source`, the tensor and what was expected.
    Status importState(Backend& backend, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::string& source);

protected:
    float m_lr = 1e-3f;
};

// Learning rate as a function of the 0-based global step.
class LrSchedule {
public:
    // {"type": "constant"} | {"type": "step", "step_size": N, "gamma": 0.1}
    // | {"type": "cosine", "decay_steps": N, "alpha": 0.0}; any of them may add
    // "warmup_steps": W (linear warm-up from 0 to the base rate over W steps).
    static Result<LrSchedule> create(const nlohmann::json& config, float baseLr);
    static LrSchedule constant(float baseLr);
    float at(int64_t step) const;
    nlohmann::json config() const;

private:
    enum class Kind { Constant, Step, Cosine } m_kind = Kind::Constant;
    float m_base = 1e-3f, m_gamma = 0.1f, m_alpha = 0.f;
    int64_t m_stepSize = 1, m_decaySteps = 1, m_warmup = 0;
};

} // namespace ts
