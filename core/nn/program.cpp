#include "nn/program.h"

#include <cmath>
#include <cstring>
#include <random>
#include <unordered_map>

#include "telemetry/breakdown.h"
#include "telemetry/tracer.h"

namespace ts {

Result<LossSpec> parseLoss(const std::string& name, bool fromLogits)
{
    LossSpec s;
    s.fromLogits = fromLogits;
    if (name == "sparse_categorical_crossentropy") s.kind = LossKind::SparseCategoricalCrossentropy;
    else if (name == "categorical_crossentropy") s.kind = LossKind::CategoricalCrossentropy;
    else if (name == "binary_crossentropy") s.kind = LossKind::BinaryCrossentropy;
    else if (name == "mean_squared_error" || name == "mse") s.kind = LossKind::MeanSquaredError;
    else
        return makeError(ErrorCode::InvalidArgument, "unknown loss '" + name + "'",
                         "use sparse_categorical_crossentropy, categorical_crossentropy, "
                         "binary_crossentropy or mean_squared_error");
    return s;
}

const char* lossName(LossKind kind)
{
    switch (kind) {
    case LossKind::SparseCategoricalCrossentropy: return "sparse_categorical_crossentropy";
    case LossKind::CategoricalCrossentropy: return "categorical_crossentropy";
    case LossKind::BinaryCrossentropy: return "binary_crossentropy";
    case LossKind::MeanSquaredError: return "mean_squared_error";
    }
    return "?";
}

Status checkLossTargets(LossKind kind, const Shape& outputShape, const Tensor& y)
{
    const int64_t n = y.shape().rank() > 0 ? y.shape()[0] : 0;
    const int64_t per = outputShape.numel();
    const bool sparse = kind == LossKind::SparseCategoricalCrossentropy;
    const bool fits = sparse ? (y.dtype() == DType::I32 && y.numel() == n)
                             : (y.dtype() == DType::I32 ? (per == 1 && kind != LossKind::CategoricalCrossentropy && y.numel() == n)
                                                        : (y.dtype() == DType::F32 && y.numel() == n * per));
    if (fits) return okStatus();
    const std::string labels =
        y.dtype() == DType::I32 && y.numel() == n ? "class ids" : std::string(dtypeName(y.dtype())) + " targets " + y.shape().toString();
    return makeError(ErrorCode::InvalidArgument,
                     std::string(lossName(kind)) + " needs " +
                         (sparse ? "one class id per example"
                                 : kind == LossKind::CategoricalCrossentropy ? "one-hot label rows of " + std::to_string(per)
                                                                                  : std::to_string(per) + " target value(s) per example") +
                         ", but the labels are " + labels,
                     sparse ? (y.dtype() == DType::F32 && y.numel() == n
                                   ? "the labels are floats: store them as integers, or cast them to class ids in the pipeline "
                                     "({\"op\": \"map\", \"fn\": \"cast\", \"dtype\": \"i32\", \"target\": \"y\"})"
                                   : "for one-hot rows use categorical_crossentropy")
                            : "for class ids use sparse_categorical_crossentropy, or map one_hot over the labels");
}

namespace {

enum class Kind { Input, Dense, Conv, Pool, GlobalAvgPool, Reshape, Dropout, BatchNorm, Act, Softmax, Add, Concat };

Result<Kind> kindOf(const std::string& type)
{
    static const std::unordered_map<std::string, Kind> map = {
        {"Input", Kind::Input}, {"Dense", Kind::Dense}, {"Conv2D", Kind::Conv},
        {"MaxPooling2D", Kind::Pool}, {"AveragePooling2D", Kind::Pool},
        {"GlobalAveragePooling2D", Kind::GlobalAvgPool}, {"Flatten", Kind::Reshape},
        {"Reshape", Kind::Reshape}, {"Dropout", Kind::Dropout},
        {"BatchNormalization", Kind::BatchNorm}, {"Activation", Kind::Act}, {"ReLU", Kind::Act},
        {"LeakyReLU", Kind::Act}, {"Softmax", Kind::Softmax}, {"Add", Kind::Add},
        {"Concatenate", Kind::Concat}};
    auto it = map.find(type);
    if (it == map.end())
        return makeError(ErrorCode::Unsupported, "layer type '" + type + "' has no executor",
                         "remove the layer or replace it with a supported one");
    return it->second;
}

Shape withBatch(int64_t n, const Shape& s)
{
    std::vector<int64_t> d;
    d.reserve(static_cast<std::size_t>(s.rank()) + 1);
    d.push_back(n);
    for (int64_t v : s.dims()) d.push_back(v);
    return Shape(std::move(d));
}

// Current-batch view of a capacity buffer allocated as (capacity, perSample).
Tensor view(const Tensor& cap, int64_t n, const Shape& s)
{
    return cap.rows(0, n).reshaped(withBatch(n, s));
}

uint64_t mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

} // namespace

struct NodeRt {
    Kind kind = Kind::Input;
    Activation act = Activation::Linear;  // fused (Dense/Conv) or the layer's own (Act)
    float alpha = 0.f;
    bool useBias = false;
    bool float32 = false;       // attrs dtype "float32": full precision under a mixed policy
    float rate = 0.f, momentum = 0.99f, epsilon = 1e-3f;
    std::vector<int> params;    // slot indices in declaration order
    std::vector<int> consumers;
    bool requiresGrad = false;
    bool reached = false;       // received a gradient in this backward pass
    // Capacity buffers (capacity rows x per-sample elements).
    Tensor out, pre, grad, preGrad, scratch, workspace, mask;
    Tensor saveMean, saveInvStd, ones, zeros, dgammaScratch, dbetaScratch;
    Tensor cur;                 // this batch's output (may alias an input's output)
    const char* forwardSpan = "forward/?";   // interned "forward/<layer id>" (detailed tracing)
    const char* backwardSpan = "backward/?";
};

// A layer pinned to float32 computes in full precision while the backend's type is 16-bit
// (Keras' dtype="float32" on a layer of a mixed-precision model); the type is restored after.
class ComputeTypeScope {
public:
    ComputeTypeScope(Backend& be, bool float32) : m_be(be), m_saved(be.computeType())
    {
        m_active = float32 && m_saved != DType::F32;
        if (m_active) switchTo(DType::F32);
    }
    ~ComputeTypeScope()
    {
        if (m_active) switchTo(m_saved);
    }
    ComputeTypeScope(const ComputeTypeScope&) = delete;
    ComputeTypeScope& operator=(const ComputeTypeScope&) = delete;

private:
    void switchTo(DType t)
    {
        // F32 is every backend's type, and m_saved was accepted when the run was built.
        [[maybe_unused]] const Status st = m_be.setComputeType(t);
        TS_ASSERT(st.ok());
    }
    Backend& m_be;
    DType m_saved;
    bool m_active = false;
};

struct Program::Impl {
    std::vector<NodeRt> nodes;
    LossParams loss;
    int inputNode = -1, outputNode = -1;
    int64_t capacity = 0, batch = 0;
    bool hostMemory = true;
    enum class Fold { None, Fused, Layer } fold = Fold::None;
    Activation foldAct = Activation::Linear;
    Tensor xDev, yDev, logits, probs;
};

Program::Program(std::shared_ptr<const GraphAnalysis> graph, Backend& backend)
    : m_graph(std::move(graph)), m_backend(backend), m_d(std::make_unique<Impl>())
{
}

Program::~Program() = default;

Result<std::unique_ptr<Program>> Program::create(std::shared_ptr<const GraphAnalysis> graph,
                                                 Backend& backend, const LossSpec& loss, Program* shared)
{
    if (!graph || !graph->ok())
        return makeError(ErrorCode::InvalidArgument, "cannot compile a model with problems",
                         "run `trainstudio-cli validate` on it and fix the reported nodes");
    std::unique_ptr<Program> p(new Program(std::move(graph), backend));
    TS_TRY(p->build(loss, shared));
    return p;
}

Status Program::build(const LossSpec& lossSpec, Program* shared)
{
    const GraphAnalysis& g = *m_graph;
    Impl& d = *m_d;
    d.hostMemory = m_backend.allocator().hostAccessible();
    if (g.inputNodes.size() != 1)
        return makeError(ErrorCode::Unsupported,
                         "the model has " + std::to_string(g.inputNodes.size()) + " Input nodes; training needs exactly one",
                         "merge the inputs into one Input layer");
    if (g.outputNodes.size() != 1)
        return makeError(ErrorCode::Unsupported,
                         "the model has " + std::to_string(g.outputNodes.size()) + " outputs; training needs exactly one",
                         "set \"outputs\" to the node the loss applies to");
    d.inputNode = g.inputNodes[0];
    d.outputNode = g.outputNodes[0];
    d.nodes.resize(g.nodes.size());

    int64_t trainableElems = 0, frozenElems = 0;
    auto aligned = [](int64_t n) { return (n + 15) / 16 * 16; };  // 64-byte slots
    for (std::size_t i = 0; i < g.nodes.size(); ++i) {
        const NodeInfo& ni = g.nodes[i];
        NodeRt& rt = d.nodes[i];
        TS_ASSIGN(rt.kind, kindOf(ni.type));
        rt.forwardSpan = telemetry::Tracer::intern("forward/" + ni.id);
        rt.backwardSpan = telemetry::Tracer::intern("backward/" + ni.id);
        const auto& a = ni.attrs;
        auto actOf = [&](const std::string& name) -> Result<Activation> { return parseActivation(name); };
        switch (rt.kind) {
        case Kind::Dense:
        case Kind::Conv: {
            TS_ASSIGN(rt.act, actOf(a.value("activation", std::string("linear"))));
            rt.useBias = a.value("use_bias", true);
            rt.float32 = a.value("dtype", std::string("policy")) == "float32";
            rt.alpha = 0.2f;  // Keras' leaky_relu function default
            break;
        }
        case Kind::Act:
            if (ni.type == "ReLU") rt.act = Activation::Relu;
            else if (ni.type == "LeakyReLU") {
                rt.act = Activation::LeakyRelu;
                rt.alpha = a.contains("alpha") ? a["alpha"].get<float>() : a.value("negative_slope", 0.3f);
            } else {
                TS_ASSIGN(rt.act, actOf(a.value("activation", std::string("linear"))));
                rt.alpha = 0.2f;
                if (rt.act == Activation::Softmax) rt.kind = Kind::Softmax;
            }
            break;
        case Kind::Softmax: rt.act = Activation::Softmax; break;
        case Kind::Dropout: rt.rate = a.value("rate", 0.0f); break;
        case Kind::BatchNorm:
            rt.momentum = a.value("momentum", 0.99f);
            rt.epsilon = a.value("epsilon", 1e-3f);
            break;
        default: break;
        }
        for (int in : ni.inputs) d.nodes[static_cast<std::size_t>(in)].consumers.push_back(static_cast<int>(i));
        for (const ParamSpec& ps : ni.params) {
            ParamSlot slot;
            slot.name = ni.id + "/" + ps.name;
            slot.node = static_cast<int>(i);
            slot.spec = ps;
            const int64_t n = ps.shape.numel();
            slot.offset = ps.trainable ? trainableElems : frozenElems;
            (ps.trainable ? trainableElems : frozenElems) += aligned(n);
            rt.params.push_back(static_cast<int>(m_slots.size()));
            m_slots.push_back(std::move(slot));
        }
    }
    // requiresGrad: a node whose output gradient is needed (it or something upstream trains).
    for (std::size_t i = 0; i < g.nodes.size(); ++i) {
        NodeRt& rt = d.nodes[i];
        bool trains = false;
        for (int s : rt.params) trains |= m_slots[static_cast<std::size_t>(s)].spec.trainable;
        for (int in : g.nodes[i].inputs) trains |= d.nodes[static_cast<std::size_t>(in)].requiresGrad;
        rt.requiresGrad = trains && rt.kind != Kind::Input;
    }

    // Loss and the output activation folded into it (stable and cheaper; predictions unchanged).
    d.loss.kind = lossSpec.kind;
    d.loss.fromLogits = lossSpec.fromLogits;
    {
        const NodeRt& out = d.nodes[static_cast<std::size_t>(d.outputNode)];
        const bool ce = lossSpec.kind == LossKind::SparseCategoricalCrossentropy ||
                        lossSpec.kind == LossKind::CategoricalCrossentropy;
        const bool bce = lossSpec.kind == LossKind::BinaryCrossentropy;
        Activation last = Activation::Linear;
        if (out.kind == Kind::Dense || out.kind == Kind::Conv) last = out.act;
        else if (out.kind == Kind::Softmax) last = Activation::Softmax;
        else if (out.kind == Kind::Act) last = out.act;
        if (!lossSpec.fromLogits && ((ce && last == Activation::Softmax) || (bce && last == Activation::Sigmoid))) {
            d.fold = (out.kind == Kind::Dense || out.kind == Kind::Conv) ? Impl::Fold::Fused : Impl::Fold::Layer;
            d.foldAct = last;
            d.loss.fromLogits = true;
            m_fold = true;
        }
    }

    Allocator& alloc = m_backend.allocator();
    if (shared) {
        if (!d.hostMemory || shared->m_trainable.numel() != trainableElems)
            return makeError(ErrorCode::Internal, "cannot share parameters between these replicas");
        m_trainable = shared->m_trainable;
    } else if (trainableElems > 0) {
        TS_ASSIGN(m_trainable, Tensor::create(Shape{trainableElems}, DType::F32, alloc));
    }
    // Non-trainable state (BN moving statistics) is per replica: replicas update it concurrently.
    if (frozenElems > 0) {
        TS_ASSIGN(m_nonTrainable, Tensor::create(Shape{frozenElems}, DType::F32, alloc));
    }
    if (trainableElems > 0) {
        TS_ASSIGN(m_gradientsWithTail, Tensor::create(Shape{trainableElems + kGradientTail}, DType::F32, alloc));
        m_gradients = m_gradientsWithTail.rows(0, trainableElems);
        std::vector<float> zeros(static_cast<std::size_t>(trainableElems + kGradientTail), 0.f);
        TS_TRY(m_backend.copyFromHost(zeros.data(), m_gradientsWithTail));
        if (!shared) TS_TRY(m_backend.copyFromHost(zeros.data(), m_trainable));
    }
    if (frozenElems > 0 && shared && shared->m_nonTrainable.defined()) {
        TS_TRY(m_backend.copyFromHost(shared->m_nonTrainable.raw(), m_nonTrainable));
    }
    for (ParamSlot& s : m_slots) {
        const int64_t n = s.spec.shape.numel();
        Tensor& arena = s.spec.trainable ? m_trainable : m_nonTrainable;
        s.value = arena.rows(s.offset, s.offset + n).reshaped(s.spec.shape);
        if (s.spec.trainable) s.grad = m_gradients.rows(s.offset, s.offset + n).reshaped(s.spec.shape);
    }
    // Constant gamma/beta for BatchNormalization without scale/center.
    for (std::size_t i = 0; i < g.nodes.size(); ++i) {
        NodeRt& rt = d.nodes[i];
        if (rt.kind != Kind::BatchNorm) continue;
        const int64_t c = g.nodes[i].outputShape[-1];
        std::vector<float> ones(static_cast<std::size_t>(c), 1.f), zeros(static_cast<std::size_t>(c), 0.f);
        TS_ASSIGN(rt.ones, Tensor::create(Shape{c}, DType::F32, alloc));
        TS_ASSIGN(rt.zeros, Tensor::create(Shape{c}, DType::F32, alloc));
        TS_ASSIGN(rt.saveMean, Tensor::create(Shape{c}, DType::F32, alloc));
        TS_ASSIGN(rt.saveInvStd, Tensor::create(Shape{c}, DType::F32, alloc));
        TS_ASSIGN(rt.dgammaScratch, Tensor::create(Shape{c}, DType::F32, alloc));
        TS_ASSIGN(rt.dbetaScratch, Tensor::create(Shape{c}, DType::F32, alloc));
        TS_TRY(m_backend.copyFromHost(ones.data(), rt.ones));
        TS_TRY(m_backend.copyFromHost(zeros.data(), rt.zeros));
    }
    return okStatus();
}

Status Program::ensureCapacity(int64_t n)
{
    Impl& d = *m_d;
    if (n <= d.capacity) return okStatus();
    const GraphAnalysis& g = *m_graph;
    Allocator& alloc = m_backend.allocator();
    auto make = [&](Tensor& t, int64_t perSample, DType dt = DType::F32) -> Status {
        TS_ASSIGN(t, Tensor::create(Shape{n, perSample}, dt, alloc));
        return okStatus();
    };
    for (std::size_t i = 0; i < g.nodes.size(); ++i) {
        NodeRt& rt = d.nodes[i];
        const NodeInfo& ni = g.nodes[i];
        const int64_t per = ni.outputShape.numel();
        const bool aliasOut = rt.kind == Kind::Input || rt.kind == Kind::Reshape;
        if (!aliasOut) TS_TRY(make(rt.out, per));
        if (rt.requiresGrad || (rt.kind == Kind::Input && false)) TS_TRY(make(rt.grad, per));
        else rt.grad = Tensor();
        // Nodes feeding several consumers accumulate gradients through a scratch buffer.
        if (rt.requiresGrad && rt.consumers.size() > 1) TS_TRY(make(rt.scratch, per));
        if ((rt.kind == Kind::Dense || rt.kind == Kind::Conv) && rt.act != Activation::Linear) {
            TS_TRY(make(rt.pre, per));
            if (rt.requiresGrad) TS_TRY(make(rt.preGrad, per));
        }
        if (rt.kind == Kind::Pool && ni.pool.kind == PoolKind::Max) TS_TRY(make(rt.workspace, per, DType::I32));
        if (rt.kind == Kind::Dropout) TS_TRY(make(rt.mask, per, DType::U8));
    }
    const int64_t inPer = g.nodes[static_cast<std::size_t>(d.inputNode)].outputShape.numel();
    if (!d.hostMemory) {
        TS_TRY(make(d.xDev, inPer));
        const NodeInfo& out = g.nodes[static_cast<std::size_t>(d.outputNode)];
        const bool sparse = d.loss.kind == LossKind::SparseCategoricalCrossentropy;
        TS_TRY(make(d.yDev, sparse ? 1 : out.outputShape.numel(), sparse ? DType::I32 : DType::F32));
    }
    d.capacity = n;
    return okStatus();
}

Status Program::forward(const Tensor& x, bool training, uint64_t seed)
{
    Impl& d = *m_d;
    const GraphAnalysis& g = *m_graph;
    const int64_t n = x.shape()[0];
    const Shape& inShape = g.nodes[static_cast<std::size_t>(d.inputNode)].outputShape;
    if (x.numel() != n * inShape.numel())
        return makeError(ErrorCode::ShapeMismatch,
                         "input batch of shape " + x.shape().toString() + " does not fit the model input " +
                             withBatch(n, inShape).toString(),
                         "check the data's feature shape against the Input layer");
    TS_TRY(ensureCapacity(n));
    d.batch = n;
    Backend& be = m_backend;

    for (std::size_t i = 0; i < g.nodes.size(); ++i) {
        NodeRt& rt = d.nodes[i];
        const NodeInfo& ni = g.nodes[i];
        const Shape oshape = withBatch(n, ni.outputShape);
        auto in = [&](int k) -> const Tensor& { return d.nodes[static_cast<std::size_t>(ni.inputs[static_cast<std::size_t>(k)])].cur; };
        auto param = [&](int k) -> Tensor& { return m_slots[static_cast<std::size_t>(rt.params[static_cast<std::size_t>(k)])].value; };
        const bool foldHere = static_cast<int>(i) == d.outputNode && d.fold != Impl::Fold::None;
        TS_TRACE_SCOPE_DETAIL(rt.forwardSpan, "forward");
        const ComputeTypeScope computeType(be, rt.float32);
        switch (rt.kind) {
        case Kind::Input:
            if (d.hostMemory) {
                rt.cur = x.reshaped(oshape);
            } else {
                Tensor dst = view(d.xDev, n, ni.outputShape);
                // Host-to-device counts as input time (TensorBoard's input-bound share).
                telemetry::PhaseScope h2d(telemetry::StepPart::Input, "host-to-device");
                TS_TRY(be.copyFromHost(x.raw(), dst));
                rt.cur = dst;
            }
            break;
        case Kind::Dense: {
            const Tensor& xin = in(0);
            Tensor x2 = xin.reshaped(Shape{n, ni.inputShapes[0].numel()});
            Tensor b = rt.useBias ? param(1) : Tensor();
            const bool fuse = rt.act == Activation::Linear || (rt.act == Activation::Relu && !foldHere);
            if (fuse) {
                rt.cur = view(rt.out, n, ni.outputShape);
                TS_TRY(be.denseForward(x2, param(0), b, rt.act, rt.cur));
            } else {
                Tensor pre = view(rt.pre, n, ni.outputShape);
                TS_TRY(be.denseForward(x2, param(0), b, Activation::Linear, pre));
                if (foldHere) {
                    d.logits = pre;
                    rt.cur = pre;
                } else {
                    rt.cur = view(rt.out, n, ni.outputShape);
                    if (rt.act == Activation::Softmax) TS_TRY(be.softmaxForward(pre, rt.cur));
                    else TS_TRY(be.activationForward(rt.act, rt.alpha, pre, rt.cur));
                }
            }
            break;
        }
        case Kind::Conv: {
            Tensor b = rt.useBias ? param(1) : Tensor();
            Tensor target = view(rt.act == Activation::Linear ? rt.out : rt.pre, n, ni.outputShape);
            TS_TRY(be.conv2dForward(in(0), param(0), b, ni.conv, target));
            if (rt.act == Activation::Linear) {
                rt.cur = target;
            } else if (foldHere) {
                d.logits = target;
                rt.cur = target;
            } else {
                rt.cur = view(rt.out, n, ni.outputShape);
                if (rt.act == Activation::Softmax) TS_TRY(be.softmaxForward(target, rt.cur));
                else TS_TRY(be.activationForward(rt.act, rt.alpha, target, rt.cur));
            }
            break;
        }
        case Kind::Pool: {
            rt.cur = view(rt.out, n, ni.outputShape);
            Tensor ws = rt.workspace.defined() ? view(rt.workspace, n, ni.outputShape) : Tensor();
            TS_TRY(be.pool2dForward(in(0), ni.pool, rt.cur, ws));
            break;
        }
        case Kind::GlobalAvgPool:
            rt.cur = view(rt.out, n, ni.outputShape);
            TS_TRY(be.globalAvgPoolForward(in(0), rt.cur));
            break;
        case Kind::Reshape:
            rt.cur = in(0).reshaped(oshape);
            break;
        case Kind::Dropout:
            if (training && rt.rate > 0.f) {
                rt.cur = view(rt.out, n, ni.outputShape);
                Tensor mask = view(rt.mask, n, ni.outputShape);
                TS_TRY(be.dropoutForward(in(0), rt.rate, mix64(seed ^ mix64(i + 1)), mask, rt.cur));
            } else {
                rt.cur = in(0);
            }
            break;
        case Kind::BatchNorm: {
            rt.cur = view(rt.out, n, ni.outputShape);
            const auto& names = ni.params;
            Tensor gamma = rt.ones, beta = rt.zeros, mean, var;
            for (std::size_t k = 0; k < names.size(); ++k) {
                if (names[k].name == "gamma") gamma = param(static_cast<int>(k));
                else if (names[k].name == "beta") beta = param(static_cast<int>(k));
                else if (names[k].name == "moving_mean") mean = param(static_cast<int>(k));
                else if (names[k].name == "moving_variance") var = param(static_cast<int>(k));
            }
            TS_TRY(be.batchNormForward(in(0), gamma, beta, mean, var, training, rt.momentum, rt.epsilon,
                                       rt.cur, rt.saveMean, rt.saveInvStd));
            break;
        }
        case Kind::Act:
            if (foldHere) {
                d.logits = in(0);
                rt.cur = in(0);
            } else {
                rt.cur = view(rt.out, n, ni.outputShape);
                TS_TRY(be.activationForward(rt.act, rt.alpha, in(0), rt.cur));
            }
            break;
        case Kind::Softmax:
            if (foldHere) {
                d.logits = in(0);
                rt.cur = in(0);
            } else {
                rt.cur = view(rt.out, n, ni.outputShape);
                TS_TRY(be.softmaxForward(in(0), rt.cur));
            }
            break;
        case Kind::Add: {
            rt.cur = view(rt.out, n, ni.outputShape);
            TS_TRY(be.add(in(0), in(1), rt.cur));
            for (std::size_t k = 2; k < ni.inputs.size(); ++k) TS_TRY(be.add(rt.cur, in(static_cast<int>(k)), rt.cur));
            break;
        }
        case Kind::Concat: {
            rt.cur = view(rt.out, n, ni.outputShape);
            std::vector<Tensor> xs;
            for (std::size_t k = 0; k < ni.inputs.size(); ++k) xs.push_back(in(static_cast<int>(k)));
            TS_TRY(be.concatForward(xs, rt.cur));
            break;
        }
        }
    }
    if (d.fold == Impl::Fold::None) d.logits = d.nodes[static_cast<std::size_t>(d.outputNode)].cur;
    d.probs = Tensor();
    return okStatus();
}

Status Program::lossAndBackward(const Tensor& y, bool backward, int64_t globalBatch, float* loss,
                                int64_t* correct, float lossScale)
{
    Impl& d = *m_d;
    const GraphAnalysis& g = *m_graph;
    Backend& be = m_backend;
    const int64_t n = d.batch;
    if (y.shape()[0] != n)
        return makeError(ErrorCode::ShapeMismatch,
                         "labels have " + std::to_string(y.shape()[0]) + " rows but the batch has " + std::to_string(n));
    const int outIdx = d.outputNode;
    NodeRt& outRt = d.nodes[static_cast<std::size_t>(outIdx)];
    const NodeInfo& outNi = g.nodes[static_cast<std::size_t>(outIdx)];
    // The loss kernels read targets in one layout; anything else is an error here, not values
    // read in the wrong dtype. Class ids for a loss that takes a value per output (one output)
    // become floats, as Keras casts y_true to the prediction's dtype.
    Tensor target = y;
    TS_TRY(checkLossTargets(d.loss.kind, outNi.outputShape, y));
    const bool sparse = d.loss.kind == LossKind::SparseCategoricalCrossentropy;
    if (!sparse && y.dtype() == DType::I32) {
        TS_ASSIGN(target, Tensor::create(Shape{n, 1}, DType::F32));
        for (int64_t i = 0; i < n; ++i) target.data<float>()[i] = static_cast<float>(y.data<int32_t>()[i]);
    }
    if (!d.hostMemory) {
        Tensor dst = d.yDev.rows(0, n).reshaped(target.shape());
        telemetry::PhaseScope h2d(telemetry::StepPart::Input, "host-to-device");
        TS_TRY(be.copyFromHost(target.raw(), dst));
        target = dst;
    }
    LossParams lp = d.loss;
    lp.globalBatch = globalBatch > 0 ? globalBatch : n;
    lp.gradScale *= lossScale;

    // Where dLoss/dlogits goes: the output node's gradient, or (folded) its pre-activation
    // gradient / its input's gradient.
    Tensor dlogits;
    if (backward) {
        for (NodeRt& rt : d.nodes) rt.reached = false;
        if (d.fold == Impl::Fold::Fused) {
            dlogits = view(outRt.preGrad, n, outNi.outputShape);
        } else if (d.fold == Impl::Fold::Layer) {
            const int src = outNi.inputs[0];
            NodeRt& srt = d.nodes[static_cast<std::size_t>(src)];
            if (srt.requiresGrad) {
                dlogits = view(srt.grad, n, g.nodes[static_cast<std::size_t>(src)].outputShape);
                srt.reached = true;
            }
        } else if (outRt.requiresGrad) {
            dlogits = view(outRt.grad, n, outNi.outputShape);
            outRt.reached = true;
        }
    }
    {
        TS_TRACE_SCOPE_DETAIL("loss", backward ? "backward" : "forward");
        TS_TRY(be.loss(lp, d.logits, target, loss, dlogits));
    }
    if (correct) {
        const bool binaryLogits = lp.kind == LossKind::BinaryCrossentropy && lp.fromLogits;
        if (lp.kind == LossKind::MeanSquaredError) *correct = 0;
        else TS_TRY(be.argmaxMatches(d.logits, target, binaryLogits, correct));
    }
    if (!backward) return okStatus();

    // Reverse topological order: every consumer has finished before its producer runs.
    for (int i = static_cast<int>(g.nodes.size()) - 1; i >= 0; --i) {
        NodeRt& rt = d.nodes[static_cast<std::size_t>(i)];
        const NodeInfo& ni = g.nodes[static_cast<std::size_t>(i)];
        const bool foldHere = i == outIdx && d.fold != Impl::Fold::None;
        if (!rt.requiresGrad) continue;
        if (!rt.reached && !(foldHere && d.fold == Impl::Fold::Fused)) {
            // No gradient flows here (not connected to the loss): its parameters get zeros.
            for (int s : rt.params) {
                ParamSlot& slot = m_slots[static_cast<std::size_t>(s)];
                if (slot.spec.trainable) TS_TRY(be.scale(0.f, slot.grad));
            }
            continue;
        }
        if (foldHere && d.fold == Impl::Fold::Layer) continue;  // gradient already went to its input
        TS_TRACE_SCOPE_DETAIL(rt.backwardSpan, "backward");
        const ComputeTypeScope computeType(be, rt.float32);
        Tensor dy = (foldHere && d.fold == Impl::Fold::Fused) ? Tensor() : view(rt.grad, n, ni.outputShape);
        auto inputNeedsGrad = [&](int k) {
            return d.nodes[static_cast<std::size_t>(ni.inputs[static_cast<std::size_t>(k)])].requiresGrad;
        };
        // Writes the gradient for input k: directly into the producer's buffer the first time,
        // else through its scratch buffer, accumulated.
        auto emit = [&](int k, auto&& op) -> Status {
            const int src = ni.inputs[static_cast<std::size_t>(k)];
            NodeRt& p = d.nodes[static_cast<std::size_t>(src)];
            const Shape& ps = g.nodes[static_cast<std::size_t>(src)].outputShape;
            Tensor gdst = view(p.grad, n, ps);
            if (!p.reached) {
                TS_TRY(op(gdst));
                p.reached = true;
            } else {
                Tensor s = view(p.scratch, n, ps);
                TS_TRY(op(s));
                TS_TRY(be.axpy(1.f, s, gdst));
            }
            return okStatus();
        };
        auto copyOp = [&](const Tensor& src) {
            return [&be, src](Tensor& dst) -> Status {
                Tensor s = src.reshaped(dst.shape());
                return be.activationForward(Activation::Linear, 0.f, s, dst);
            };
        };
        auto param = [&](int k) -> ParamSlot& { return m_slots[static_cast<std::size_t>(rt.params[static_cast<std::size_t>(k)])]; };
        auto in = [&](int k) -> const Tensor& { return d.nodes[static_cast<std::size_t>(ni.inputs[static_cast<std::size_t>(k)])].cur; };

        switch (rt.kind) {
        case Kind::Input: break;
        case Kind::Dense:
        case Kind::Conv: {
            // Gradient w.r.t. the pre-activation.
            Tensor dpre;
            if (foldHere) {
                dpre = view(rt.preGrad, n, ni.outputShape);
            } else if (rt.act == Activation::Linear) {
                dpre = dy;
            } else {
                dpre = view(rt.preGrad, n, ni.outputShape);
                Tensor pre = rt.act == Activation::Relu && rt.kind == Kind::Dense ? rt.cur : view(rt.pre, n, ni.outputShape);
                if (rt.act == Activation::Softmax) TS_TRY(be.softmaxBackward(rt.cur, dy, dpre));
                else TS_TRY(be.activationBackward(rt.act, rt.alpha, pre, rt.cur, dy, dpre));
            }
            Tensor db = rt.useBias ? param(1).grad : Tensor();
            if (rt.kind == Kind::Dense) {
                Tensor x2 = in(0).reshaped(Shape{n, ni.inputShapes[0].numel()});
                Tensor dx;
                if (inputNeedsGrad(0)) {
                    TS_TRY(emit(0, [&](Tensor& dst) -> Status {
                        Tensor dx2 = dst.reshaped(Shape{n, ni.inputShapes[0].numel()});
                        return be.denseBackward(x2, param(0).value, dpre, dx2, param(0).grad, db, false);
                    }));
                } else {
                    TS_TRY(be.denseBackward(x2, param(0).value, dpre, dx, param(0).grad, db, false));
                }
            } else {
                TS_TRY(be.conv2dBackwardWeights(in(0), dpre, ni.conv, param(0).grad, db));
                if (inputNeedsGrad(0))
                    TS_TRY(emit(0, [&](Tensor& dst) { return be.conv2dBackwardData(dpre, param(0).value, ni.conv, dst); }));
            }
            break;
        }
        case Kind::Pool:
            if (inputNeedsGrad(0)) {
                Tensor ws = rt.workspace.defined() ? view(rt.workspace, n, ni.outputShape) : Tensor();
                TS_TRY(emit(0, [&](Tensor& dst) { return be.pool2dBackward(dy, ws, ni.pool, dst); }));
            }
            break;
        case Kind::GlobalAvgPool:
            if (inputNeedsGrad(0)) TS_TRY(emit(0, [&](Tensor& dst) { return be.globalAvgPoolBackward(dy, dst); }));
            break;
        case Kind::Reshape:
            if (inputNeedsGrad(0)) TS_TRY(emit(0, copyOp(dy)));
            break;
        case Kind::Dropout:
            if (inputNeedsGrad(0)) {
                if (rt.rate > 0.f) {
                    Tensor mask = view(rt.mask, n, ni.outputShape);
                    TS_TRY(emit(0, [&](Tensor& dst) { return be.dropoutBackward(dy, mask, rt.rate, dst); }));
                } else {
                    TS_TRY(emit(0, copyOp(dy)));
                }
            }
            break;
        case Kind::BatchNorm: {
            Tensor gamma = rt.ones, dgamma = rt.dgammaScratch, dbeta = rt.dbetaScratch;
            for (std::size_t k = 0; k < ni.params.size(); ++k) {
                if (ni.params[k].name == "gamma") { gamma = param(static_cast<int>(k)).value; dgamma = param(static_cast<int>(k)).grad; }
                else if (ni.params[k].name == "beta") dbeta = param(static_cast<int>(k)).grad;
            }
            if (inputNeedsGrad(0)) {
                TS_TRY(emit(0, [&](Tensor& dst) {
                    return be.batchNormBackward(in(0), gamma, rt.saveMean, rt.saveInvStd, dy, dst, dgamma, dbeta);
                }));
            } else {
                // Parameter gradients only: dx goes to scratch-free output via a temporary view of
                // this node's own output buffer (unused after backward).
                Tensor tmp = view(rt.out, n, ni.outputShape);
                TS_TRY(be.batchNormBackward(in(0), gamma, rt.saveMean, rt.saveInvStd, dy, tmp, dgamma, dbeta));
            }
            break;
        }
        case Kind::Act:
            if (inputNeedsGrad(0))
                TS_TRY(emit(0, [&](Tensor& dst) { return be.activationBackward(rt.act, rt.alpha, in(0), rt.cur, dy, dst); }));
            break;
        case Kind::Softmax:
            if (inputNeedsGrad(0)) TS_TRY(emit(0, [&](Tensor& dst) { return be.softmaxBackward(rt.cur, dy, dst); }));
            break;
        case Kind::Add:
            for (std::size_t k = 0; k < ni.inputs.size(); ++k)
                if (inputNeedsGrad(static_cast<int>(k))) TS_TRY(emit(static_cast<int>(k), copyOp(dy)));
            break;
        case Kind::Concat: {
            // Split dy into per-input pieces; inputs that need no gradient get scratch targets.
            std::vector<Tensor> parts;
            std::vector<Tensor> owned;
            bool any = false;
            for (std::size_t k = 0; k < ni.inputs.size(); ++k) any |= inputNeedsGrad(static_cast<int>(k));
            if (!any) break;
            for (std::size_t k = 0; k < ni.inputs.size(); ++k) {
                TS_ASSIGN(Tensor t, Tensor::create(withBatch(n, ni.inputShapes[k]), DType::F32, be.allocator()));
                parts.push_back(t);
            }
            TS_TRY(be.concatBackward(dy, parts));
            for (std::size_t k = 0; k < ni.inputs.size(); ++k)
                if (inputNeedsGrad(static_cast<int>(k))) TS_TRY(emit(static_cast<int>(k), copyOp(parts[k])));
            break;
        }
        }
    }
    return okStatus();
}

Result<Tensor> Program::outputs()
{
    Impl& d = *m_d;
    const NodeInfo& outNi = m_graph->nodes[static_cast<std::size_t>(d.outputNode)];
    const int64_t n = d.batch;
    Tensor src = d.logits;
    if (d.fold != Impl::Fold::None) {
        TS_ASSIGN(Tensor probs, Tensor::create(withBatch(n, outNi.outputShape), DType::F32, m_backend.allocator()));
        if (d.foldAct == Activation::Softmax) TS_TRY(m_backend.softmaxForward(src, probs));
        else TS_TRY(m_backend.activationForward(d.foldAct, 0.f, src, probs));
        src = probs;
    }
    Tensor host = Tensor::empty(withBatch(n, outNi.outputShape));
    TS_TRY(m_backend.copyToHost(src, host.raw()));
    return host;
}

Status Program::initialiseParameters(uint64_t seed)
{
    std::mt19937_64 rng(seed);
    auto uniform = [&]() { return static_cast<double>(rng() >> 11) * 0x1.0p-53; };
    for (ParamSlot& s : m_slots) {
        const int64_t n = s.spec.shape.numel();
        std::vector<float> host(static_cast<std::size_t>(n), 0.f);
        if (s.spec.init == "glorot_uniform") {
            const double limit = std::sqrt(6.0 / static_cast<double>(s.spec.fanIn + s.spec.fanOut));
            for (auto& v : host) v = static_cast<float>((uniform() * 2.0 - 1.0) * limit);
        } else if (s.spec.init == "ones") {
            std::fill(host.begin(), host.end(), 1.f);
        } else if (s.spec.init != "zeros" && !s.spec.init.empty()) {
            return makeError(ErrorCode::Unsupported, "parameter " + s.name + ": unknown initialiser '" + s.spec.init + "'");
        }
        TS_TRY(m_backend.copyFromHost(host.data(), s.value));
    }
    return okStatus();
}

Result<std::vector<std::pair<std::string, Tensor>>> Program::exportParameters()
{
    std::vector<std::pair<std::string, Tensor>> out;
    TS_TRY(m_backend.synchronize());
    for (const ParamSlot& s : m_slots) {
        Tensor host = Tensor::empty(s.spec.shape);
        TS_TRY(m_backend.copyToHost(s.value, host.raw()));
        out.emplace_back(s.name, host);
    }
    return out;
}

Status Program::importParameters(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                 const std::string& source, bool partial)
{
    std::unordered_map<std::string, const Tensor*> byName;
    for (const auto& [name, t] : tensors) byName[name] = &t;
    std::string missing;
    for (ParamSlot& s : m_slots) {
        auto it = byName.find(s.name);
        if (it == byName.end()) {
            missing += (missing.empty() ? "" : ", ") + s.name;
            continue;
        }
        const Tensor& t = *it->second;
        if (t.shape() != s.spec.shape)
            return makeError(ErrorCode::ShapeMismatch,
                             source + ": tensor '" + s.name + "' has shape " + t.shape().toString() + ", the model expects " +
                                 s.spec.shape.toString(),
                             "the weights belong to a different model (Keras layouts: Dense kernel (in, out), "
                             "Conv2D kernel (kh, kw, in, out))");
        // Half-precision weights (saved for size, or from mixed-precision training) widen exactly.
        if (t.dtype() != DType::F32 && t.dtype() != DType::F16 && t.dtype() != DType::BF16)
            return makeError(ErrorCode::InvalidArgument,
                             source + ": tensor '" + s.name + "' holds " + dtypeName(t.dtype()) + " values; weights must be floating point",
                             "save the weights as F32, F16 or BF16");
        if (const int64_t at = t.firstNonFinite(); at >= 0)
            return makeError(ErrorCode::InvalidArgument,
                             source + ": tensor '" + s.name + "' holds " + nonFiniteName(t.floatAt(at)) + " at index " + std::to_string(at) +
                                 " of " + std::to_string(t.numel()),
                             "the weights were saved from a run that diverged; load an earlier checkpoint, or train "
                             "again with a lower learning rate");
        TS_ASSIGN(Tensor value, t.widenedToF32());
        TS_TRY(m_backend.copyFromHost(value.raw(), s.value));
        byName.erase(it);
    }
    if (!missing.empty() && !partial)
        return makeError(ErrorCode::NotFound, source + ": missing weights for " + missing,
                         "tensor names are '<layer name>/kernel', '/bias', ...; layer names must match the model");
    if (!byName.empty()) {
        std::string extra;
        for (const auto& [name, t] : byName) extra += (extra.empty() ? "" : ", ") + name;
        return makeError(ErrorCode::InvalidArgument, source + ": tensors not in the model: " + extra,
                         "the weights belong to a different model, or its layers were renamed");
    }
    return okStatus();
}

} // namespace ts
