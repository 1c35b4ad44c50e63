#include "backend/backend.h"

#include <algorithm>

namespace ts {

const char* opKindName(OpKind k)
{
    switch (k) {
    case OpKind::Gemm: return "gemm";
    case OpKind::DenseForward: return "dense_forward";
    case OpKind::DenseBackward: return "dense_backward";
    case OpKind::Conv2dForward: return "conv2d_forward";
    case OpKind::Conv2dBackwardData: return "conv2d_backward_data";
    case OpKind::Conv2dBackwardWeights: return "conv2d_backward_weights";
    case OpKind::Pool2dForward: return "pool2d_forward";
    case OpKind::Pool2dBackward: return "pool2d_backward";
    case OpKind::GlobalAvgPoolForward: return "global_avg_pool_forward";
    case OpKind::GlobalAvgPoolBackward: return "global_avg_pool_backward";
    case OpKind::BatchNormForward: return "batch_norm_forward";
    case OpKind::BatchNormBackward: return "batch_norm_backward";
    case OpKind::ActivationForward: return "activation_forward";
    case OpKind::ActivationBackward: return "activation_backward";
    case OpKind::SoftmaxForward: return "softmax_forward";
    case OpKind::SoftmaxBackward: return "softmax_backward";
    case OpKind::DropoutForward: return "dropout_forward";
    case OpKind::DropoutBackward: return "dropout_backward";
    case OpKind::Add: return "add";
    case OpKind::Axpy: return "axpy";
    case OpKind::Scale: return "scale";
    case OpKind::ConcatForward: return "concat_forward";
    case OpKind::ConcatBackward: return "concat_backward";
    case OpKind::Loss: return "loss";
    case OpKind::ArgmaxMatches: return "argmax_matches";
    case OpKind::SgdUpdate: return "sgd_update";
    case OpKind::AdamUpdate: return "adam_update";
    case OpKind::RmspropUpdate: return "rmsprop_update";
    case OpKind::SumSquares: return "sum_squares";
    case OpKind::CopyFromHost: return "copy_from_host";
    case OpKind::CopyToHost: return "copy_to_host";
    case OpKind::Count_: break;
    }
    return "?";
}

const char* activationName(Activation a)
{
    switch (a) {
    case Activation::Linear: return "linear";
    case Activation::Relu: return "relu";
    case Activation::LeakyRelu: return "leaky_relu";
    case Activation::Gelu: return "gelu";
    case Activation::Sigmoid: return "sigmoid";
    case Activation::Tanh: return "tanh";
    case Activation::Softmax: return "softmax";
    }
    return "?";
}

Result<Activation> parseActivation(const std::string& name)
{
    // Keras writes a missing activation as "linear" in to_json() and as None in Python code.
    if (name == "linear" || name.empty() || name == "None" || name == "none" || name == "null")
        return Activation::Linear;
    if (name == "relu") return Activation::Relu;
    if (name == "leaky_relu") return Activation::LeakyRelu;
    if (name == "gelu") return Activation::Gelu;
    if (name == "sigmoid") return Activation::Sigmoid;
    if (name == "tanh") return Activation::Tanh;
    if (name == "softmax") return Activation::Softmax;
    return makeError(ErrorCode::InvalidArgument, "unknown activation '" + name + "'",
                     "valid activations: linear (or None), relu, leaky_relu, gelu, sigmoid, tanh, "
                     "softmax");
}

namespace {
inline uint64_t splitmix64(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
} // namespace

bool dropoutKeep(uint64_t seed, uint64_t index, float rate)
{
    const uint64_t h = splitmix64(seed ^ (index * 0x9E3779B97F4A7C15ull));
    // Top 24 bits: exactly representable in a float, so u and the comparison are the same on
    // every device.
    const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
    return u >= rate;
}

int64_t countArgmaxMatches(const Tensor& pred, const Tensor& target, bool binaryFromLogits)
{
    const int64_t N = pred.shape()[0];
    const int64_t C = N == 0 ? 0 : pred.numel() / N;
    const float* P = pred.data<float>();
    auto argmax = [](const float* v, int64_t n) {
        int64_t best = 0;
        for (int64_t k = 1; k < n; ++k)
            if (v[k] > v[best]) best = k;
        return best;
    };
    int64_t count = 0;
    for (int64_t r = 0; r < N; ++r) {
        if (C == 1) {
            const bool predicted = binaryFromLogits ? P[r] > 0.0f : P[r] > 0.5f;
            const double t = target.dtype() == DType::I32 ? double(target.data<int32_t>()[r])
                                                          : double(target.data<float>()[r]);
            if (predicted == (t > 0.5)) ++count;
            continue;
        }
        const int64_t predicted = argmax(P + r * C, C);
        int64_t expected;
        if (target.dtype() == DType::I32) {
            TS_ASSERT(target.numel() == N);
            expected = target.data<int32_t>()[r];
        } else {
            TS_ASSERT(target.dtype() == DType::F32 && target.numel() == pred.numel());
            expected = argmax(target.data<float>() + r * C, C);
        }
        if (predicted == expected) ++count;
    }
    return count;
}

Status Backend::setComputeType(DType t)
{
    if (!supportsComputeType(t))
        return makeError(ErrorCode::Unsupported,
                         info().name + " (" + name() + " backend) cannot compute in " + dtypeName(t),
                         "train in float32 (--precision float32) or on a device that supports this policy");
    m_computeType = t;
    return okStatus();
}

Status Backend::computeRounded(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                               const std::function<Status(const std::vector<Tensor>&)>& op)
{
    const DType t = m_computeType;
    std::vector<Tensor> rounded;
    rounded.reserve(inputs.size());
    for (const Tensor& in : inputs) {
        if (!in.defined()) {
            rounded.push_back(in);
            continue;
        }
        TS_ASSERT(in.hostAccessible() && in.dtype() == DType::F32);
        // Grow-only buffers, one per operand: a fresh allocation per call costs page faults on
        // every large activation.
        const std::size_t k = rounded.size();
        if (m_roundScratch.size() <= k) m_roundScratch.resize(k + 1);
        Tensor& buf = m_roundScratch[k];
        if (!buf.defined() || buf.numel() < in.numel()) {
            buf = Tensor();
            TS_ASSIGN(buf, Tensor::create(Shape{std::max<int64_t>(1, in.numel())}, DType::F32));
        }
        Tensor copy = buf.rows(0, in.numel()).reshaped(in.shape());
        roundToDType(in.data<float>(), copy.data<float>(), in.numel(), t);
        rounded.push_back(std::move(copy));
    }
    m_computeType = DType::F32;
    Status st = op(rounded);
    m_computeType = t;
    if (!st.ok()) return st;
    for (const Tensor& out : outputs)
        if (out.defined()) roundToDType(out.data<float>(), out.data<float>(), out.numel(), t);
    return okStatus();
}

} // namespace ts
