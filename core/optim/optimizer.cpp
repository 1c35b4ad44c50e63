#include <cstdio>
#include "optim/optimizer.h"
#include "common/utf8.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <map>
#include <set>

namespace ts {
namespace {

Result<float> number(const nlohmann::json& cfg, const char* key, float def, float lo, float hi, bool loOpen = false)
{
    if (!cfg.contains(key) || cfg[key].is_null()) return def;
    if (!cfg[key].is_number())
        return makeError(ErrorCode::InvalidArgument, std::string("optimizer: '") + key + "' must be a number");
    // Checked as written (a double), before narrowing: 1e308 is out of range, not "inf".
    const double v = cfg[key].get<double>();
    auto shown = [](double x) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%g", x);
        return std::string(buf);
    };
    if (!(v >= lo && v <= hi) || (loOpen && v == lo))
        return makeError(ErrorCode::InvalidArgument, std::string("optimizer: '") + key + "' = " + shown(v) + " is out of range",
                         "use a value in " + std::string(loOpen ? "(" : "[") + shown(lo) + ", " + shown(hi) + "]");
    return static_cast<float>(v);
}

Status checkKeys(const nlohmann::json& cfg, const std::set<std::string>& allowed, const std::string& type)
{
    // Keras serialises bookkeeping keys (accepted), and settings this engine does not implement
    // with their defaults (accepted at the default only: a clipnorm dropped silently trained
    // exactly as without it).
    static const std::set<std::string> ignored = {"type", "name", "class_name", "ema_momentum", "ema_overwrite_frequency",
                                                  "jit_compile", "is_legacy_optimizer"};
    auto isDefault = [&](const std::string& key) {
        const nlohmann::json& v = cfg[key];
        if (v.is_null()) return true;
        if (key == "decay") return v.is_number() && v.get<double>() == 0.0;
        if (key == "use_ema" || key == "amsgrad") return v.is_boolean() && !v.get<bool>();
        if (key == "gradient_accumulation_steps") return v.is_number() && v.get<double>() == 1.0;
        if (key == "weight_decay") return v.is_number() && v.get<double>() == 0.0;  // RMSprop: Keras writes its base optimizer's null
        return false;  // clipnorm, clipvalue, global_clipnorm, loss_scale_factor: null only
    };
    static const std::map<std::string, std::string> unimplemented = {
        {"decay", "Keras 2's per-step learning-rate decay is not supported: set it to 0 and give the run a \"schedule\""},
        {"clipnorm", "gradient clipping is not supported yet: remove clipnorm (or set it to null)"},
        {"clipvalue", "gradient clipping is not supported yet: remove clipvalue (or set it to null)"},
        {"global_clipnorm", "gradient clipping is not supported yet: remove global_clipnorm (or set it to null)"},
        {"use_ema", "an exponential moving average of the weights is not supported: set use_ema to false"},
        {"amsgrad", "amsgrad is not supported: set amsgrad to false"},
        {"gradient_accumulation_steps", "gradient accumulation is not supported: use a larger batch (or set it to null)"},
        {"loss_scale_factor", "a fixed loss scale factor is set with the run's precision (\"loss_scale\"): set it to null here"},
        {"weight_decay", "weight decay is implemented for adamw and sgd: set it to null here, or use one of those"},
    };
    for (auto it = cfg.begin(); it != cfg.end(); ++it) {
        if (allowed.count(it.key()) || ignored.count(it.key())) continue;
        if (const auto u = unimplemented.find(it.key()); u != unimplemented.end()) {
            if (isDefault(it.key())) continue;
            return makeError(ErrorCode::Unsupported, "optimizer '" + type + "': " + it.key() + " = " + it.value().dump() + " would be ignored",
                             u->second);
        }
        std::string list;
        for (const auto& k : allowed) list += (list.empty() ? "" : ", ") + k;
        return makeError(ErrorCode::InvalidArgument, "optimizer '" + type + "': unknown setting '" + it.key() + "'",
                         "known settings: " + list);
    }
    return okStatus();
}

Result<Tensor> zeroState(Backend& be, int64_t n)
{
    TS_ASSIGN(Tensor t, Tensor::create(Shape{n}, DType::F32, be.allocator()));
    std::vector<float> z(static_cast<std::size_t>(n), 0.f);
    TS_TRY(be.copyFromHost(z.data(), t));
    return t;
}

Tensor slice(const Tensor& t, int64_t b, int64_t e) { return t.reshaped(Shape{t.numel()}).rows(b, e); }

class Sgd final : public Optimizer {
public:
    SgdParams p;
    Tensor velocity;
    std::string name() const override { return "sgd"; }
    nlohmann::json config() const override
    {
        return {{"type", "sgd"}, {"learning_rate", m_lr}, {"momentum", p.momentum}, {"nesterov", p.nesterov},
                {"weight_decay", p.weightDecay}};
    }
    Status prepare(Backend& be, int64_t n) override
    {
        TS_ASSIGN(velocity, zeroState(be, n));
        return okStatus();
    }
    Status apply(Backend& be, const Tensor& params, const Tensor& grads, int64_t b, int64_t e, float lr, int64_t) override
    {
        SgdParams q = p;
        q.lr = lr;
        Tensor ps = slice(params, b, e), v = slice(velocity, b, e);
        return be.sgdUpdate(q, ps, slice(grads, b, e), v);
    }
    std::vector<std::pair<std::string, Tensor>> state() const override { return {{"sgd/velocity", velocity}}; }
};

class Adam final : public Optimizer {
public:
    AdamParams p;
    bool decoupled = false;
    Tensor m, v;
    std::string name() const override { return decoupled ? "adamw" : "adam"; }
    nlohmann::json config() const override
    {
        nlohmann::json j = {{"type", name()}, {"learning_rate", m_lr}, {"beta_1", p.beta1}, {"beta_2", p.beta2},
                            {"epsilon", p.epsilon}};
        if (decoupled) j["weight_decay"] = p.weightDecay;
        return j;
    }
    Status prepare(Backend& be, int64_t n) override
    {
        TS_ASSIGN(m, zeroState(be, n));
        TS_ASSIGN(v, zeroState(be, n));
        return okStatus();
    }
    Status apply(Backend& be, const Tensor& params, const Tensor& grads, int64_t b, int64_t e, float lr, int64_t step) override
    {
        AdamParams q = p;
        q.lr = lr;
        q.step = step;
        Tensor ps = slice(params, b, e), ms = slice(m, b, e), vs = slice(v, b, e);
        return be.adamUpdate(q, ps, slice(grads, b, e), ms, vs);
    }
    std::vector<std::pair<std::string, Tensor>> state() const override { return {{"adam/m", m}, {"adam/v", v}}; }
};

class Rmsprop final : public Optimizer {
public:
    RmspropParams p;
    Tensor ms, mom, mg;
    std::string name() const override { return "rmsprop"; }
    nlohmann::json config() const override
    {
        return {{"type", "rmsprop"}, {"learning_rate", m_lr}, {"rho", p.rho}, {"momentum", p.momentum},
                {"epsilon", p.epsilon}, {"centered", p.centered}};
    }
    Status prepare(Backend& be, int64_t n) override
    {
        TS_ASSIGN(ms, zeroState(be, n));
        TS_ASSIGN(mom, zeroState(be, n));
        TS_ASSIGN(mg, zeroState(be, n));
        return okStatus();
    }
    Status apply(Backend& be, const Tensor& params, const Tensor& grads, int64_t b, int64_t e, float lr, int64_t) override
    {
        RmspropParams q = p;
        q.lr = lr;
        Tensor ps = slice(params, b, e), a = slice(ms, b, e), c = slice(mom, b, e), d = slice(mg, b, e);
        return be.rmspropUpdate(q, ps, slice(grads, b, e), a, c, d);
    }
    std::vector<std::pair<std::string, Tensor>> state() const override
    {
        return {{"rmsprop/ms", ms}, {"rmsprop/momentum", mom}, {"rmsprop/mg", mg}};
    }
};

} // namespace

Result<std::vector<std::pair<std::string, Tensor>>> Optimizer::exportState(Backend& backend) const
{
    std::vector<std::pair<std::string, Tensor>> out;
    for (const auto& [name, t] : state()) {
        if (!t.defined()) continue;  // prepare() was never called (a model without weights)
        TS_ASSIGN(Tensor host, Tensor::create(Shape{t.numel()}, DType::F32));
        TS_TRY(backend.copyToHost(t, host.data<float>()));
        out.emplace_back(name, std::move(host));
    }
    return out;
}

Status Optimizer::importState(Backend& backend, const std::vector<std::pair<std::string, Tensor>>& tensors,
                              const std::string& source)
{
    for (auto [name, t] : state()) {
        if (!t.defined()) continue;
        auto it = std::find_if(tensors.begin(), tensors.end(), [&](const auto& p) { return p.first == name; });
        if (it == tensors.end())
            return makeError(ErrorCode::InvalidArgument,
                             source + ": no optimizer state '" + name + "' (it was saved by another optimizer than " + this->name() + ")",
                             "resume with the optimizer the checkpoint was trained with, or start a new run");
        const Tensor& h = it->second;
        if (h.dtype() != DType::F32 || h.numel() != t.numel())
            return makeError(ErrorCode::InvalidArgument,
                             source + ": optimizer state '" + name + "' has " + std::to_string(h.numel()) + " values, this model needs " +
                                 std::to_string(t.numel()),
                             "the checkpoint belongs to a different model; start a new run");
        TS_TRY(backend.copyFromHost(h.data<float>(), t));
    }
    return okStatus();
}

Result<std::unique_ptr<Optimizer>> Optimizer::create(const nlohmann::json& cfgIn)
{
    nlohmann::json cfg = cfgIn.is_string() ? nlohmann::json{{"type", cfgIn}} : cfgIn;
    if (!cfg.is_object())
        return makeError(ErrorCode::InvalidArgument, "optimizer must be a name or an object like {\"type\": \"adam\"}");
    const std::string type = lowerAscii(cfg.value("type", cfg.value("class_name", std::string())));
    if (type.empty())
        return makeError(ErrorCode::InvalidArgument, "optimizer has no \"type\"", "use adam, adamw, sgd or rmsprop");
    if (type == "adam" || type == "adamw") {
        auto o = std::make_unique<Adam>();
        o->decoupled = type == "adamw";
        TS_TRY(checkKeys(cfg, {"learning_rate", "beta_1", "beta_2", "epsilon", "weight_decay"}, type));
        TS_ASSIGN(o->m_lr, number(cfg, "learning_rate", 1e-3f, 0.f, 1e3f, true));
        TS_ASSIGN(o->p.beta1, number(cfg, "beta_1", 0.9f, 0.f, 0.999999f));
        TS_ASSIGN(o->p.beta2, number(cfg, "beta_2", 0.999f, 0.f, 0.9999999f));
        TS_ASSIGN(o->p.epsilon, number(cfg, "epsilon", 1e-7f, 0.f, 1.f, /*loOpen=*/true));  // 0 divides by zero at step 2
        TS_ASSIGN(o->p.weightDecay, number(cfg, "weight_decay", o->decoupled ? 0.004f : 0.f, 0.f, 1.f));
        if (!o->decoupled && o->p.weightDecay != 0.f)
            return makeError(ErrorCode::InvalidArgument, "optimizer 'adam': weight_decay is only for adamw",
                             "use {\"type\": \"adamw\"} for decoupled weight decay");
        return std::unique_ptr<Optimizer>(std::move(o));
    }
    if (type == "sgd") {
        auto o = std::make_unique<Sgd>();
        TS_TRY(checkKeys(cfg, {"learning_rate", "momentum", "nesterov", "weight_decay"}, type));
        TS_ASSIGN(o->m_lr, number(cfg, "learning_rate", 0.01f, 0.f, 1e3f, true));
        TS_ASSIGN(o->p.momentum, number(cfg, "momentum", 0.f, 0.f, 0.999999f));
        TS_ASSIGN(o->p.weightDecay, number(cfg, "weight_decay", 0.f, 0.f, 1.f));
        o->p.nesterov = cfg.value("nesterov", false);
        if (o->p.nesterov && o->p.momentum == 0.f)
            return makeError(ErrorCode::InvalidArgument, "optimizer 'sgd': nesterov needs momentum > 0",
                             "set momentum, e.g. 0.9");
        return std::unique_ptr<Optimizer>(std::move(o));
    }
    if (type == "rmsprop") {
        auto o = std::make_unique<Rmsprop>();
        TS_TRY(checkKeys(cfg, {"learning_rate", "rho", "momentum", "epsilon", "centered"}, type));
        TS_ASSIGN(o->m_lr, number(cfg, "learning_rate", 1e-3f, 0.f, 1e3f, true));
        TS_ASSIGN(o->p.rho, number(cfg, "rho", 0.9f, 0.f, 0.999999f));
        TS_ASSIGN(o->p.momentum, number(cfg, "momentum", 0.f, 0.f, 0.999999f));
        TS_ASSIGN(o->p.epsilon, number(cfg, "epsilon", 1e-7f, 0.f, 1.f, /*loOpen=*/true));  // 0 divides by zero at step 2
        o->p.centered = cfg.value("centered", false);
        return std::unique_ptr<Optimizer>(std::move(o));
    }
    return makeError(ErrorCode::InvalidArgument, "unknown optimizer '" + type + "'", "use adam, adamw, sgd or rmsprop");
}

Result<LrSchedule> LrSchedule::create(const nlohmann::json& cfg, float baseLr)
{
    LrSchedule s;
    s.m_base = baseLr;
    if (cfg.is_null()) return s;
    if (!cfg.is_object())
        return makeError(ErrorCode::InvalidArgument, "learning-rate schedule must be an object like {\"type\": \"cosine\", ...}");
    const std::string type = cfg.value("type", std::string("constant"));
    auto intKey = [&](const char* k, int64_t def, int64_t lo) -> Result<int64_t> {
        if (!cfg.contains(k)) return def;
        if (!cfg[k].is_number_integer() || cfg[k].get<int64_t>() < lo)
            return makeError(ErrorCode::InvalidArgument,
                             std::string("schedule '") + type + "': '" + k + "' must be an integer >= " + std::to_string(lo));
        return cfg[k].get<int64_t>();
    };
    TS_ASSIGN(s.m_warmup, intKey("warmup_steps", 0, 0));
    if (type == "constant") {
        s.m_kind = Kind::Constant;
    } else if (type == "step") {
        s.m_kind = Kind::Step;
        TS_ASSIGN(s.m_stepSize, intKey("step_size", 1000, 1));
        s.m_gamma = cfg.value("gamma", 0.1f);
        if (!(s.m_gamma > 0.f && s.m_gamma <= 1.f))
            return makeError(ErrorCode::InvalidArgument, "schedule 'step': 'gamma' must be in (0, 1]");
    } else if (type == "cosine") {
        s.m_kind = Kind::Cosine;
        TS_ASSIGN(s.m_decaySteps, intKey("decay_steps", 1000, 1));
        s.m_alpha = cfg.value("alpha", 0.f);
        if (!(s.m_alpha >= 0.f && s.m_alpha <= 1.f))
            return makeError(ErrorCode::InvalidArgument, "schedule 'cosine': 'alpha' must be in [0, 1]");
    } else {
        return makeError(ErrorCode::InvalidArgument, "unknown learning-rate schedule '" + type + "'",
                         "use constant, step or cosine (each may add warmup_steps)");
    }
    return s;
}

LrSchedule LrSchedule::constant(float baseLr)
{
    LrSchedule s;
    s.m_base = baseLr;
    return s;
}

float LrSchedule::at(int64_t step) const
{
    if (m_warmup > 0 && step < m_warmup) return m_base * static_cast<float>(step + 1) / static_cast<float>(m_warmup);
    const int64_t t = step - m_warmup;
    switch (m_kind) {
    case Kind::Constant: return m_base;
    case Kind::Step: return m_base * std::pow(m_gamma, static_cast<float>(t / m_stepSize));
    case Kind::Cosine: {
        const double frac = std::min<double>(1.0, static_cast<double>(t) / static_cast<double>(m_decaySteps));
        const double cosv = 0.5 * (1.0 + std::cos(std::numbers::pi * frac));
        return static_cast<float>(m_base * ((1.0 - m_alpha) * cosv + m_alpha));
    }
    }
    return m_base;
}

nlohmann::json LrSchedule::config() const
{
    nlohmann::json j;
    switch (m_kind) {
    case Kind::Constant: j = {{"type", "constant"}}; break;
    case Kind::Step: j = {{"type", "step"}, {"step_size", m_stepSize}, {"gamma", m_gamma}}; break;
    case Kind::Cosine: j = {{"type", "cosine"}, {"decay_steps", m_decaySteps}, {"alpha", m_alpha}}; break;
    }
    if (m_warmup) j["warmup_steps"] = m_warmup;
    return j;
}

} // namespace ts
