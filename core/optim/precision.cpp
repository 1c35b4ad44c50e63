#include "optim/precision.h"

#include <cmath>
#include <limits>

#include "backend/backend.h"
#include "common/json_keys.h"

namespace ts {

const char* precisionPolicyName(PrecisionPolicy p)
{
    switch (p) {
    case PrecisionPolicy::Float32: return "float32";
    case PrecisionPolicy::MixedFloat16: return "mixed_float16";
    case PrecisionPolicy::MixedBfloat16: return "mixed_bfloat16";
    }
    return "float32";
}

DType PrecisionConfig::computeType() const
{
    switch (policy) {
    case PrecisionPolicy::Float32: return DType::F32;
    case PrecisionPolicy::MixedFloat16: return DType::F16;
    case PrecisionPolicy::MixedBfloat16: return DType::BF16;
    }
    return DType::F32;
}

Result<PrecisionPolicy> PrecisionConfig::parsePolicy(const std::string& name, const std::string& where)
{
    for (PrecisionPolicy p : {PrecisionPolicy::Float32, PrecisionPolicy::MixedFloat16, PrecisionPolicy::MixedBfloat16})
        if (name == precisionPolicyName(p)) return p;
    std::string hint = "use float32, mixed_float16 or mixed_bfloat16 (Keras' policy names)";
    if (name == "float16" || name == "bfloat16")
        hint = "variables stay float32 here: use mixed_" + name + " (Keras' mixed-precision policy)";
    return makeError(ErrorCode::InvalidArgument, where + ": precision policy '" + name + "' is not a policy", hint);
}

Result<PrecisionConfig> PrecisionConfig::fromJson(const nlohmann::json& j, const std::string& where)
{
    PrecisionConfig c;
    if (j.is_null()) return c;
    if (j.is_string()) {
        TS_ASSIGN(c.policy, parsePolicy(j.get<std::string>(), where));
        return c;
    }
    if (!j.is_object())
        return makeError(ErrorCode::ParseError, where + ": precision is " + j.dump(),
                         "write a policy name (\"mixed_bfloat16\") or an object {\"policy\": ...}");
    TS_TRY(checkJsonKeys(j, {"policy", "loss_scale", "initial_scale", "growth_steps"}, where + ": precision"));
    if (j.contains("policy")) {
        if (!j["policy"].is_string())
            return makeError(ErrorCode::ParseError, where + ": precision.policy is " + j["policy"].dump(),
                             "use float32, mixed_float16 or mixed_bfloat16");
        TS_ASSIGN(c.policy, parsePolicy(j["policy"].get<std::string>(), where));
    }
    auto positive = [&](const char* key, double value, const char* hint) -> Status {
        if (!std::isfinite(value) || value < 1.0)
            return makeError(ErrorCode::InvalidArgument, where + ": precision." + key + " is " + j[key].dump(), hint);
        // The scale is a float: a larger double would become inf.
        if (value > static_cast<double>(std::numeric_limits<float>::max()))
            return makeError(ErrorCode::InvalidArgument, where + ": precision." + key + " is " + j[key].dump() + ", more than a float holds",
                             "use a scale below 3.4e38; 32768 is Keras' default");
        return okStatus();
    };
    if (j.contains("loss_scale")) {
        const auto& ls = j["loss_scale"];
        if (ls.is_string() && ls.get<std::string>() == "dynamic") {
            c.dynamic = true;
        } else if (ls.is_number()) {
            TS_TRY(positive("loss_scale", ls.get<double>(), "a fixed loss scale is a number of 1 or more (Keras: 2^15 = 32768 is typical)"));
            c.dynamic = false;
            c.initialScale = ls.get<float>();
        } else {
            return makeError(ErrorCode::InvalidArgument, where + ": precision.loss_scale is " + ls.dump(),
                             "use \"dynamic\" or a fixed number such as 1024");
        }
    }
    if (j.contains("initial_scale")) {
        if (!j["initial_scale"].is_number())
            return makeError(ErrorCode::ParseError, where + ": precision.initial_scale is " + j["initial_scale"].dump(),
                             "use a number of 1 or more (Keras' default is 32768)");
        TS_TRY(positive("initial_scale", j["initial_scale"].get<double>(), "use a number of 1 or more (Keras' default is 32768)"));
        if (!c.dynamic)
            return makeError(ErrorCode::InvalidArgument, where + ": precision has both a fixed loss_scale and initial_scale",
                             "initial_scale is for the dynamic loss scale; drop one of them");
        c.initialScale = j["initial_scale"].get<float>();
    }
    if (j.contains("growth_steps")) {
        if (!j["growth_steps"].is_number_integer() || j["growth_steps"].get<int64_t>() < 1)
            return makeError(ErrorCode::InvalidArgument, where + ": precision.growth_steps is " + j["growth_steps"].dump(),
                             "use a whole number of steps, 1 or more (Keras' default is 2000)");
        c.growthSteps = j["growth_steps"].get<int64_t>();
    }
    if (!std::isfinite(c.initialScale))
        return makeError(ErrorCode::InvalidArgument, where + ": the loss scale " + std::to_string(c.initialScale) + " is not a finite float",
                         "use a scale below 3.4e38; 32768 is Keras' default");
    return c;
}

nlohmann::json PrecisionConfig::toJson() const
{
    const PrecisionConfig defaults;
    if (dynamic == defaults.dynamic && initialScale == defaults.initialScale && growthSteps == defaults.growthSteps)
        return precisionPolicyName(policy);
    nlohmann::json j = {{"policy", precisionPolicyName(policy)}};
    if (dynamic) {
        j["loss_scale"] = "dynamic";
        j["initial_scale"] = initialScale;
        j["growth_steps"] = growthSteps;
    } else {
        j["loss_scale"] = initialScale;
    }
    return j;
}

LossScaler::LossScaler(const PrecisionConfig& config) : m_config(config), m_scale(config.initialScale) {}

bool LossScaler::update(bool finite)
{
    if (!finite) {
        ++m_skipped;
        m_good = 0;
        if (m_config.dynamic) m_scale = std::max(1.0f, m_scale * 0.5f);
        return false;
    }
    if (m_config.dynamic && ++m_good >= m_config.growthSteps) {
        const float grown = m_scale * 2.0f;
        if (std::isfinite(grown)) m_scale = grown;
        m_good = 0;
    }
    return true;
}

std::vector<float> LossScaler::state() const
{
    return {m_scale, static_cast<float>(m_good), static_cast<float>(m_skipped)};
}

Status LossScaler::restore(const std::vector<float>& state, const std::string& source)
{
    if (state.size() != 3 || !std::isfinite(state[0]) || state[0] < 1.0f || state[1] < 0 || state[2] < 0)
        return makeError(ErrorCode::ParseError, source + ": the loss-scale state is malformed",
                         "the backup was not written by this version; start the run afresh");
    m_scale = state[0];
    m_good = static_cast<int64_t>(state[1]);
    m_skipped = static_cast<int64_t>(state[2]);
    return okStatus();
}

Result<bool> unscaleGradients(Backend& be, Tensor& grads, float scale)
{
    double squares = 0;
    TS_TRY(be.sumSquares(grads, &squares));
    if (!std::isfinite(squares)) return false;
    TS_TRY(be.scale(1.0f / scale, grads));
    return true;
}

} // namespace ts
