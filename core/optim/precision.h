#pragma once
// Mixed precision, as Keras does it: a policy names the type layers compute in (variables stay
// float32), and under mixed_float16 a LossScaler keeps small gradients from vanishing in f16 by
// scaling the loss before backward and unscaling the gradients before the update.
// Contract: PrecisionConfig is a value; a LossScaler belongs to the one thread that drives the
// training steps (the Strategy's caller). Errors name the JSON key and the accepted values.

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "tensor/tensor.h"

namespace ts {

class Backend;

enum class PrecisionPolicy { Float32, MixedFloat16, MixedBfloat16 };
const char* precisionPolicyName(PrecisionPolicy p);  // Keras names: "float32", "mixed_float16", ...

struct PrecisionConfig {
    PrecisionPolicy policy = PrecisionPolicy::Float32;
    // Loss scaling (mixed_float16 only; bfloat16 has float32's range and needs none), with
    // Keras' LossScaleOptimizer defaults: dynamic, starting at 2^15, doubled after 2000 finite
    // steps in a row, halved (and the step skipped) on a non-finite gradient. `dynamic` false
    // keeps initialScale fixed (steps with non-finite gradients are still skipped).
    bool dynamic = true;
    float initialScale = 32768.0f;
    int64_t growthSteps = 2000;

    DType computeType() const;
    bool scalesLoss() const { return policy == PrecisionPolicy::MixedFloat16; }

    // "float32" | "mixed_float16" | "mixed_bfloat16", or an object
    // {"policy": ..., "loss_scale": "dynamic" | <fixed number>, "initial_scale": 32768,
    //  "growth_steps": 2000}. `where` names the document for messages.
    static Result<PrecisionConfig> fromJson(const nlohmann::json& j, const std::string& where);
    static Result<PrecisionPolicy> parsePolicy(const std::string& name, const std::string& where);
    // The short string when everything else is the default, else the object.
    nlohmann::json toJson() const;
};

class LossScaler {
public:
    explicit LossScaler(const PrecisionConfig& config);

    float scale() const { return m_scale; }
    // After a step's gradients were checked: true if the step's update is to be applied.
    // Non-finite: the step is skipped and a dynamic scale halves (never below 1). Finite: after
    // growthSteps finite steps in a row a dynamic scale doubles.
    bool update(bool finite);
    int64_t skippedSteps() const { return m_skipped; }
    int64_t goodSteps() const { return m_good; }

    // Backup state: {scale, finite steps in a row, skipped steps} as floats (exact up to 2^24).
    std::vector<float> state() const;
    Status restore(const std::vector<float>& state, const std::string& source);

private:
    PrecisionConfig m_config;
    float m_scale;
    int64_t m_good = 0;
    int64_t m_skipped = 0;
};

// One loss-scaled step's check: true if every gradient in `grads` (of a loss multiplied by
// `scale`) is finite, and then they are divided by `scale`; false leaves them as they are (the
// step is to be skipped). On `be`, the backend that holds `grads`.
Result<bool> unscaleGradients(Backend& be, Tensor& grads, float scale);

} // namespace ts
