#include "data/dataset.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <thread>

#include "data/idx.h"

namespace ts {

namespace {

std::string joinDims(const std::vector<int64_t>& dims)
{
    std::string s;
    for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? " x " : "") + std::to_string(dims[i]);
    return s;
}

uint64_t splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

} // namespace

Result<InMemoryDataset> loadIdxDataset(const std::string& imagesPath, const std::string& labelsPath, bool flatten)
{
    TS_ASSIGN(IdxArray images, readIdx(imagesPath));
    TS_ASSIGN(IdxArray labels, readIdx(labelsPath));

    if (images.dims.size() < 2)
        return makeError(ErrorCode::ShapeMismatch,
                         "image file '" + imagesPath + "' has shape " + joinDims(images.dims) +
                             "; expected (N, H, W) images",
                         "is this a label file? pass the *-images-idx3-ubyte file as images");
    if (labels.dims.size() != 1)
        return makeError(ErrorCode::ShapeMismatch,
                         "label file '" + labelsPath + "' has shape " + joinDims(labels.dims) +
                             "; expected one label per image (rank 1)",
                         "is this an image file? pass the *-labels-idx1-ubyte file as labels");
    const int64_t n = images.dims[0];
    if (labels.dims[0] != n)
        return makeError(ErrorCode::ShapeMismatch,
                         "image file '" + imagesPath + "' holds " + std::to_string(n) + " images but label file '" +
                             labelsPath + "' holds " + std::to_string(labels.dims[0]) + " labels",
                         "the two files must come from the same split (train-* with train-*, t10k-* with t10k-*)");

    std::vector<int64_t> xdims;
    if (flatten || images.dims.size() == 2) {
        int64_t features = 1;
        for (std::size_t i = 1; i < images.dims.size(); ++i) features *= images.dims[i];
        xdims = {n, features};
    } else {
        const auto& d = images.dims;
        if (d.size() == 3) xdims = {d[0], d[1], d[2], 1};  // (N, H, W) -> NHWC with one channel
        else xdims = d;
    }

    InMemoryDataset ds;
    TS_ASSIGN(ds.x, Tensor::create(Shape(xdims), DType::F32));
    TS_ASSIGN(ds.y, Tensor::create(Shape{n}, DType::I32));

    std::array<float, 256> scale;
    for (int v = 0; v < 256; ++v) scale[static_cast<std::size_t>(v)] = static_cast<float>(v) / 255.f;
    float* x = ds.x.data<float>();
    const uint8_t* src = images.data.data();
    for (std::size_t i = 0, e = images.data.size(); i < e; ++i) x[i] = scale[src[i]];

    int32_t* y = ds.y.data<int32_t>();
    int32_t maxLabel = -1;
    for (int64_t i = 0; i < n; ++i) {
        y[i] = labels.data[static_cast<std::size_t>(i)];
        maxLabel = std::max(maxLabel, y[i]);
    }
    ds.numClasses = maxLabel + 1;
    ds.source = imagesPath + " + " + labelsPath;
    return ds;
}

Result<IdxFolder> loadIdxFolder(const std::string& dir, bool flatten, bool testRequired)
{
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::is_directory(dir, ec))
        return makeError(ErrorCode::NotFound, "data folder '" + dir + "' does not exist or is not a folder",
                         "install the Debian package dataset-fashion-mnist (it fills "
                         "/usr/share/datasets/fashion-mnist) or pass --data DIR");

    const char* const names[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                                  "t10k-labels-idx1-ubyte"};
    std::string paths[4];
    std::string missing;
    for (int i = 0; i < 4; ++i) {
        const fs::path gz = fs::path(dir) / (std::string(names[i]) + ".gz");
        const fs::path raw = fs::path(dir) / names[i];
        if (fs::is_regular_file(gz, ec)) paths[i] = gz.string();
        else if (fs::is_regular_file(raw, ec)) paths[i] = raw.string();
        else if (i < 2 || testRequired) missing += (missing.empty() ? "" : ", ") + std::string(names[i]) + "(.gz)";
    }
    if (!missing.empty())
        return makeError(ErrorCode::NotFound, "data folder '" + dir + "' lacks " + missing,
                         std::string("an IDX folder needs train-images-idx3-ubyte, train-labels-idx1-ubyte") +
                             (testRequired ? ", t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte (the test split; "
                                             "not needed without validation)"
                                           : "") +
                             ", each raw or gzipped; the Debian package dataset-fashion-mnist installs them in "
                             "/usr/share/datasets/fashion-mnist");

    // Decompressing is the slow part (about 0.4 s for the training images): read the test split
    // on a second thread meanwhile.
    std::optional<Result<InMemoryDataset>> test;
    std::thread worker;
    if (!paths[2].empty() && !paths[3].empty()) worker = std::thread([&] { test.emplace(loadIdxDataset(paths[2], paths[3], flatten)); });
    else test.emplace(InMemoryDataset{});
    Result<InMemoryDataset> train = loadIdxDataset(paths[0], paths[1], flatten);
    if (worker.joinable()) worker.join();
    if (!train.ok()) return train.takeError();
    if (!test->ok()) return test->takeError();
    return IdxFolder{std::move(train).value(), std::move(*test).value()};
}

std::string defaultFashionMnistDir()
{
    const char* env = std::getenv("TRAINSTUDIO_FMNIST_DIR");
    if (env && *env) return env;
    return "/usr/share/datasets/fashion-mnist";
}

// ---------------------------------------------------------------------------------------------

InMemoryBatchSource::InMemoryBatchSource(const InMemoryDataset& dataset, const Options& options, int64_t count)
    : m_data(dataset), m_options(options), m_count(count)
{
    const Shape& xs = dataset.x.shape();
    m_xRowShape = options.featureShape.rank() > 0 ? options.featureShape
                                                  : Shape(std::vector<int64_t>(xs.dims().begin() + 1, xs.dims().end()));
    const Shape& ys = dataset.y.shape();
    m_yRowShape = Shape(std::vector<int64_t>(ys.dims().begin() + 1, ys.dims().end()));
    m_xRowBytes = static_cast<std::size_t>(xs.product(1, xs.rank())) * dtypeSize(dataset.x.dtype());
    m_yRowBytes = static_cast<std::size_t>(ys.product(1, ys.rank())) * dtypeSize(dataset.y.dtype());
}

Result<std::unique_ptr<InMemoryBatchSource>> InMemoryBatchSource::create(const InMemoryDataset& dataset,
                                                                         const Options& options)
{
    const std::string what = dataset.source.empty() ? std::string("in-memory dataset")
                                                    : "dataset '" + dataset.source + "'";
    if (!dataset.x.defined() || !dataset.y.defined() || dataset.x.shape().rank() < 1 || dataset.y.shape().rank() < 1)
        return makeError(ErrorCode::InvalidArgument, what + " has no x or y tensor");
    if (!dataset.x.hostAccessible() || !dataset.y.hostAccessible())
        return makeError(ErrorCode::InvalidArgument, what + " is not in host memory",
                         "load datasets into host tensors; batches are copied to devices later");
    if (dataset.x.shape()[0] != dataset.y.shape()[0])
        return makeError(ErrorCode::ShapeMismatch,
                         what + ": x has " + std::to_string(dataset.x.shape()[0]) + " examples but y has " +
                             std::to_string(dataset.y.shape()[0]));
    if (options.batchSize < 1)
        return makeError(ErrorCode::InvalidArgument,
                         "batch size must be >= 1 (got " + std::to_string(options.batchSize) + ")");
    if (options.limit < 0)
        return makeError(ErrorCode::InvalidArgument,
                         "example limit must be >= 0 (0 = all), got " + std::to_string(options.limit));
    if (options.shardCount < 1 || options.shardIndex < 0 || options.shardIndex >= options.shardCount)
        return makeError(ErrorCode::InvalidArgument, "shard " + std::to_string(options.shardIndex) + " of " +
                                                         std::to_string(options.shardCount) + " does not exist");
    const int64_t n = dataset.x.shape()[0];
    const int64_t count = options.limit == 0 ? n : std::min(options.limit, n);
    if (count == 0) return makeError(ErrorCode::InvalidArgument, what + " has no examples");
    if (options.batchSize > count)
        return makeError(ErrorCode::InvalidArgument,
                         "batch size " + std::to_string(options.batchSize) + " is larger than the " +
                             std::to_string(count) + " examples of " + what +
                             (count < n ? " (limited from " + std::to_string(n) + ")" : std::string()),
                         "lower the batch size or use more examples");
    if (options.featureShape.rank() > 0) {
        const Shape& xs = dataset.x.shape();
        const int64_t row = xs.product(1, xs.rank());
        for (int64_t d : options.featureShape.dims())
            if (d < 1)
                return makeError(ErrorCode::InvalidArgument,
                                 "feature shape " + options.featureShape.toString() + " has a dimension < 1");
        if (options.featureShape.numel() != row)
            return makeError(ErrorCode::ShapeMismatch,
                             "feature shape " + options.featureShape.toString() + " holds " +
                                 std::to_string(options.featureShape.numel()) + " values but each example of " +
                                 what + " has shape " +
                                 Shape(std::vector<int64_t>(xs.dims().begin() + 1, xs.dims().end())).toString() +
                                 " (" + std::to_string(row) + " values)",
                             "use the model's input shape, e.g. (28, 28, 1) for 784-value images");
    }
    return std::unique_ptr<InMemoryBatchSource>(new InMemoryBatchSource(dataset, options, count));
}

Status InMemoryBatchSource::startEpoch(int64_t epoch)
{
    if (m_cancelled.load(std::memory_order_relaxed))
        return makeError(ErrorCode::Cancelled, "batch source over '" + m_data.source + "' was cancelled");
    if (epoch < 0)
        return makeError(ErrorCode::InvalidArgument, "epoch must be >= 0, got " + std::to_string(epoch));
    m_order.resize(static_cast<std::size_t>(m_count));
    std::iota(m_order.begin(), m_order.end(), int64_t(0));
    if (m_options.shuffle) {
        std::mt19937_64 rng(splitmix64(m_options.seed) ^ splitmix64(static_cast<uint64_t>(epoch) + 0x9E3779B97F4A7C15ull));
        for (std::size_t i = m_order.size() - 1; i > 0; --i) {
            const auto j = static_cast<std::size_t>((static_cast<unsigned __int128>(rng()) * (i + 1)) >> 64);
            std::swap(m_order[i], m_order[j]);
        }
    }
    m_cursor = 0;
    m_started = true;
    return okStatus();
}

Result<InMemoryBatchSource::Buffers> InMemoryBatchSource::acquireBuffers(int64_t rows)
{
    // A slot is free when only the pool holds its storage (storage() itself returns one more copy).
    auto isFree = [](const Buffers& b) {
        return b.x.defined() && b.x.storage().use_count() == 2 && b.y.storage().use_count() == 2;
    };
    for (Buffers& b : m_pool)
        if (isFree(b) && b.x.shape()[0] == rows) return b;

    int slot = m_nextSlot;
    for (int s = 0; s < 2; ++s)
        if (!m_pool[s].x.defined() || isFree(m_pool[s])) slot = s;
    m_nextSlot = 1 - slot;

    std::vector<int64_t> xd{rows};
    xd.insert(xd.end(), m_xRowShape.dims().begin(), m_xRowShape.dims().end());
    std::vector<int64_t> yd{rows};
    yd.insert(yd.end(), m_yRowShape.dims().begin(), m_yRowShape.dims().end());
    Buffers fresh;
    TS_ASSIGN(fresh.x, Tensor::create(Shape(std::move(xd)), m_data.x.dtype()));
    TS_ASSIGN(fresh.y, Tensor::create(Shape(std::move(yd)), m_data.y.dtype()));
    m_pool[slot] = fresh;
    return fresh;
}

Result<std::optional<Batch>> InMemoryBatchSource::next()
{
    if (m_cancelled.load(std::memory_order_relaxed))
        return makeError(ErrorCode::Cancelled, "batch source over '" + m_data.source + "' was cancelled");
    if (!m_started)
        return makeError(ErrorCode::Internal, "InMemoryBatchSource::next() called before startEpoch()");
    const int64_t remaining = m_count - m_cursor;
    if (remaining <= 0 || (m_options.dropRemainder && remaining < m_options.batchSize))
        return std::optional<Batch>{};
    const int64_t globalRows = std::min(m_options.batchSize, remaining);
    const int64_t lo = globalRows * m_options.shardIndex / m_options.shardCount;
    const int64_t rows = globalRows * (m_options.shardIndex + 1) / m_options.shardCount - lo;
    TS_ASSIGN(Buffers buf, acquireBuffers(rows));

    const auto* xs = static_cast<const unsigned char*>(m_data.x.raw());
    const auto* ys = static_cast<const unsigned char*>(m_data.y.raw());
    auto* xd = static_cast<unsigned char*>(buf.x.raw());
    auto* yd = static_cast<unsigned char*>(buf.y.raw());
    // A shuffled gather reads rows from all over the dataset (DRAM-bound, ~16% of the seed MLP's
    // step on one thread); the trainer's threads share it, as they share the step's kernels.
    const int64_t* order = m_order.data() + m_cursor + lo;
    const std::size_t xRow = m_xRowBytes, yRow = m_yRowBytes;
#pragma omp parallel for schedule(static) if (rows * static_cast<int64_t>(xRow) >= (int64_t(1) << 16))
    for (int64_t r = 0; r < rows; ++r) {
        const auto idx = static_cast<std::size_t>(order[r]);
        std::memcpy(xd + static_cast<std::size_t>(r) * xRow, xs + idx * xRow, xRow);
        std::memcpy(yd + static_cast<std::size_t>(r) * yRow, ys + idx * yRow, yRow);
    }
    m_cursor += globalRows;
    return std::optional<Batch>(Batch{buf.x, buf.y, m_options.shardCount > 1 ? globalRows : -1, lo});
}

int64_t InMemoryBatchSource::batchesPerEpoch() const
{
    const int64_t b = m_options.batchSize;
    return m_options.dropRemainder ? m_count / b : (m_count + b - 1) / b;
}

int64_t InMemoryBatchSource::examplesPerEpoch() const
{
    return m_options.dropRemainder ? m_count / m_options.batchSize * m_options.batchSize : m_count;
}

} // namespace ts
