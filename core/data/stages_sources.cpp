// Source stages: in-memory arrays (IDX, .npy, .npz, from_tensor_slices), CSV files, image folders,
// and the file interleaving of multi-file sources.

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>

#include "data/csv.h"
#include "data/idx.h"
#include "data/image_folder.h"
#include "data/npz.h"
#include "data/stages.h"
#include "io/npy.h"

namespace ts::pipeline_detail {

void Counters::reset()
{
    produced = 0;
    busyNs = 0;
    blockedNs = 0;
    skipped = 0;
    bytes = 0;
}

void ChainControl::requestStop()
{
    m_stop.store(true, std::memory_order_release);
    wakeAll();
}

void ChainControl::wakeAll()
{
    std::lock_guard<std::mutex> lock(m_mutex);
    for (Waker* w : m_live) w->wake();
}

void ChainControl::add(Waker* w)
{
    std::lock_guard<std::mutex> lock(m_mutex);
    m_live.push_back(w);
}

void ChainControl::remove(Waker* w)
{
    std::lock_guard<std::mutex> lock(m_mutex);
    m_live.erase(std::remove(m_live.begin(), m_live.end(), w), m_live.end());
}

void Shared::recordBad(const Error& e)
{
    badCount.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(badMutex);
    if (badMessages.size() < 20) badMessages.push_back(e.message);
}

Error cancelledError() { return makeError(ErrorCode::Cancelled, "the input pipeline was stopped"); }

bool isRecordError(const Error& e)
{
    return e.code == ErrorCode::ParseError || e.code == ErrorCode::InvalidArgument || e.code == ErrorCode::ShapeMismatch ||
           e.code == ErrorCode::NotFound || e.code == ErrorCode::IoError;
}

namespace {

namespace fs = std::filesystem;

std::string joinDims(const std::vector<int64_t>& d)
{
    std::string s;
    for (std::size_t i = 0; i < d.size(); ++i) s += (i ? " x " : "") + std::to_string(d[i]);
    return s;
}

// A whole dataset in memory: x and y indexed by dimension 0.
struct Arrays {
    Tensor x, y;
    Shape xRow, yRow;
    int64_t n = 0;
    std::shared_ptr<const std::string> origin, labelOrigin;
    // The rows holding NaN or inf, in order (found once, where the arrays load): the first fails
    // the source, or with skip_bad_records each is dropped and counted as it is reached (its
    // error made then: nonFiniteRow).
    std::vector<int64_t> badRows;
    std::string what, labelWhat;  // for the errors of the rows after it
};

// The error of `row` if it holds NaN or inf (features first), else nullopt.
std::optional<Error> nonFiniteRow(const Arrays& a, int64_t row)
{
    for (const auto& [t, role, shape] : {std::tuple{&a.x, "features", &a.xRow}, std::tuple{&a.y, "labels", &a.yRow}}) {
        if (!t->defined()) continue;
        const int64_t rel = t->rows(row, row + 1).firstNonFinite();
        if (rel < 0) continue;
        const int64_t perRow = std::max<int64_t>(1, shape->numel());
        return makeError(ErrorCode::InvalidArgument,
                         (t == &a.y && !a.labelWhat.empty() ? a.labelWhat : a.what) + ": the " + role + " hold " +
                             nonFiniteName(t->floatAt(row * perRow + rel)) + " at row " + std::to_string(row) +
                             (perRow > 1 ? " (value " + std::to_string(rel) + " of " + std::to_string(perRow) + ")" : std::string()),
                         "replace or drop the rows that are not finite before training (numpy: keep the rows where "
                         "np.isfinite(x).all(axis=1), or x = np.nan_to_num(x)), or set skip_bad_records");
    }
    return std::nullopt;
}

Shape rowShape(const Tensor& t)
{
    return Shape(std::vector<int64_t>(t.shape().dims().begin() + 1, t.shape().dims().end()));
}

// Labels become i32 class ids (from u8/i32) or f32 rows (a rank-1 f32 vector becomes (N, 1)).
Result<Tensor> normaliseLabels(const Tensor& y, const std::string& what)
{
    if (!y.defined()) return y;
    if (y.dtype() == DType::U8) {
        TS_ASSIGN(Tensor out, Tensor::create(y.shape(), DType::I32));
        const uint8_t* s = y.data<uint8_t>();
        int32_t* d = out.data<int32_t>();
        for (int64_t i = 0, n = y.numel(); i < n; ++i) d[i] = s[i];
        return out;
    }
    if (y.dtype() == DType::F32 && y.shape().rank() == 1) return y.reshaped(Shape{y.shape()[0], 1});
    if (y.dtype() == DType::I32 || y.dtype() == DType::F32) return y;
    return makeError(ErrorCode::Unsupported, what + ": labels of dtype " + std::string(dtypeName(y.dtype())) + " are not supported");
}

// `labelOrigin`/`labelWhat`: the labels' own file, when they come from another one than the features.
Result<std::shared_ptr<const Arrays>> makeArrays(Tensor x, Tensor y, const std::string& origin, const std::string& what,
                                                 const std::string& labelOrigin = {}, const std::string& labelWhat = {})
{
    auto a = std::make_shared<Arrays>();
    if (!x.defined() || x.shape().rank() < 1)
        return makeError(ErrorCode::ShapeMismatch, what + ": the features need at least one dimension (the elements)");
    TS_ASSIGN(a->y, normaliseLabels(y, labelWhat.empty() ? what : labelWhat));
    a->x = std::move(x);
    a->n = a->x.shape()[0];
    if (a->y.defined() && (a->y.shape().rank() < 1 || a->y.shape()[0] != a->n))
        return makeError(ErrorCode::ShapeMismatch,
                         what + ": mismatched arrays: x has " + std::to_string(a->n) + " rows (shape " + a->x.shape().toString() +
                             ") but y has shape " + a->y.shape().toString(),
                         "features and labels must hold the same number of examples");
    a->xRow = rowShape(a->x);
    if (a->y.defined()) a->yRow = rowShape(a->y);
    // NaN or inf in the data would spread through the weights within a step (CSV values are
    // refused line by line as they are read; arrays are checked here, once, where they load).
    a->what = what;
    a->labelWhat = labelWhat;
    for (const auto& [t, shape] : {std::pair{&a->x, &a->xRow}, std::pair{&a->y, &a->yRow}}) {
        if (!t->defined()) continue;
        const int64_t perRow = std::max<int64_t>(1, shape->numel());
        for (int64_t from = 0; from < a->n;) {
            const int64_t rel = t->rows(from, a->n).firstNonFinite();
            if (rel < 0) break;
            a->badRows.push_back(from + rel / perRow);
            from = a->badRows.back() + 1;
        }
    }
    std::sort(a->badRows.begin(), a->badRows.end());
    a->badRows.erase(std::unique(a->badRows.begin(), a->badRows.end()), a->badRows.end());
    if (!origin.empty()) a->origin = std::make_shared<const std::string>(origin);  // in-memory tensors: no file
    if (!labelOrigin.empty()) a->labelOrigin = std::make_shared<const std::string>(labelOrigin);
    return std::shared_ptr<const Arrays>(std::move(a));
}

std::string findIdxFile(const std::string& dir, const std::string& base)
{
    std::error_code ec;
    const fs::path gz = fs::path(dir) / (base + ".gz");
    if (fs::is_regular_file(gz, ec)) return gz.string();
    return (fs::path(dir) / base).string();
}

Result<std::shared_ptr<const Arrays>> loadIdx(const SourceSpec& s)
{
    std::string images, labels;
    if (s.paths.size() == 2) {
        images = s.paths[0];
        labels = s.paths[1];
    } else {
        const std::string prefix = s.split == "test" ? "t10k" : "train";
        images = findIdxFile(s.dir, prefix + "-images-idx3-ubyte");
        labels = findIdxFile(s.dir, prefix + "-labels-idx1-ubyte");
    }
    // A file the pipeline names: the hint is about its source, not the default data (--data).
    auto read = [&s](const std::string& path, const char* key) -> Result<IdxArray> {
        auto a = readIdx(path);
        if (!a.ok() && a.error().code == ErrorCode::NotFound) {
            Error e = a.takeError();
            e.hint = s.paths.size() == 2 ? std::string("check pipeline.source.") + key + " (the paths are read as given)"
                                         : "check pipeline.source.dir: it must hold the MNIST-style files of the split";
            return e;
        }
        return a;
    };
    TS_ASSIGN(IdxArray img, read(images, "images"));
    TS_ASSIGN(IdxArray lab, read(labels, "labels"));
    if (img.dims.size() < 2)
        return makeError(ErrorCode::ShapeMismatch, "IDX image file '" + images + "' has shape " + joinDims(img.dims) +
                                                       "; expected (N, H, W) images",
                         "is it a label file? pass the *-images-idx3-ubyte file as images");
    if (lab.dims.size() != 1)
        return makeError(ErrorCode::ShapeMismatch, "IDX label file '" + labels + "' has shape " + joinDims(lab.dims) +
                                                       "; expected one label per image",
                         "is it an image file? pass the *-labels-idx1-ubyte file as labels");
    const int64_t n = img.dims[0];
    if (lab.dims[0] != n)
        return makeError(ErrorCode::ShapeMismatch, "IDX image file '" + images + "' holds " + std::to_string(n) +
                                                       " images but label file '" + labels + "' holds " +
                                                       std::to_string(lab.dims[0]) + " labels",
                         "the two files must come from the same split");
    std::vector<int64_t> xdims;
    if (s.layout == "image") {
        // (N, H, W) gains a channel dimension: NHWC, as Keras lays images out.
        xdims = img.dims.size() == 3 ? std::vector<int64_t>{img.dims[0], img.dims[1], img.dims[2], 1} : img.dims;
    } else {
        int64_t f = 1;
        for (std::size_t i = 1; i < img.dims.size(); ++i) f *= img.dims[i];
        xdims = {n, f};
    }
    TS_ASSIGN(Tensor x, Tensor::create(Shape(xdims), DType::U8));
    std::memcpy(x.raw(), img.data.data(), img.data.size());
    TS_ASSIGN(Tensor y, Tensor::create(Shape{n}, DType::I32));
    for (int64_t i = 0; i < n; ++i) y.data<int32_t>()[i] = lab.data[static_cast<std::size_t>(i)];
    return makeArrays(std::move(x), std::move(y), images, "IDX files '" + images + "' + '" + labels + "'", labels, "IDX labels file '" + labels + "'");
}

Result<std::shared_ptr<const Arrays>> loadNpy(const SourceSpec& s)
{
    TS_ASSIGN(Tensor x, readNpy(s.paths[0]));
    Tensor y;
    if (s.paths.size() > 1) {
        TS_ASSIGN(y, readNpy(s.paths[1]));
        if (y.shape().rank() < 1 || x.shape().rank() < 1 || y.shape()[0] != x.shape()[0])
            return makeError(ErrorCode::ShapeMismatch,
                             "mismatched .npy files: '" + s.paths[0] + "' has shape " + x.shape().toString() + " but '" +
                                 s.paths[1] + "' has shape " + y.shape().toString(),
                             "features and labels must hold the same number of examples (dimension 0)");
    }
    if (s.paths.size() > 1) return makeArrays(std::move(x), std::move(y), s.paths[0], "'" + s.paths[0] + "'", s.paths[1], "'" + s.paths[1] + "'");
    return makeArrays(std::move(x), std::move(y), s.paths[0], "'" + s.paths[0] + "'");
}

Result<std::shared_ptr<const Arrays>> loadNpz(const std::string& path, const SourceSpec& s)
{
    std::string xk = s.xKey, yk = s.yKey;
    if (xk.empty() || yk.empty()) {
        TS_ASSIGN(std::vector<std::string> names, listNpz(path));
        auto has = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) != names.end(); };
        if (xk.empty()) xk = has("x") || !has("x_train") ? "x" : "x_train";
        if (yk.empty()) yk = has("y") || !has("y_train") ? "y" : "y_train";
    }
    auto read = readNpz(path, {xk, yk});
    if (!read.ok()) {
        Error e = read.takeError();
        // The names were guessed: say how to give the file's own.
        if (e.code == ErrorCode::NotFound && (s.xKey.empty() || s.yKey.empty()))
            e.hint += std::string(e.hint.empty() ? "" : "; ") + "name the features and labels with the source's \"x_key\" and \"y_key\"";
        return e;
    }
    auto& arrays = read.value();
    Tensor& x = arrays[xk];
    Tensor& y = arrays[yk];
    if (x.shape().rank() < 1 || y.shape().rank() < 1 || x.shape()[0] != y.shape()[0])
        return makeError(ErrorCode::ShapeMismatch,
                         ".npz file '" + path + "' is mismatched: '" + xk + "' has shape " + x.shape().toString() + " but '" +
                             yk + "' has shape " + y.shape().toString(),
                         "features and labels must hold the same number of examples (dimension 0)");
    return makeArrays(std::move(x), std::move(y), path, ".npz file '" + path + "'");
}

// Serves rows of loaded arrays. `load` runs on the first next(), so file errors surface there.
class ArrayIterator final : public Iterator {
public:
    using Loader = std::function<Result<std::shared_ptr<const Arrays>>()>;
    ArrayIterator(Loader load, const IterContext& ctx, Counters* counters, bool countProduced, uint64_t keyBase)
        : m_load(std::move(load)), m_ctx(ctx), m_counters(counters), m_countProduced(countProduced), m_keyBase(keyBase)
    {
    }

    Next next() override
    {
        if (m_ctx.chain->stopped()) return cancelledError();
        const int64_t t0 = nowNs();
        if (!m_arrays) {
            TS_TRY(load());
        }
        TS_TRY(passBadRows());
        if (m_i >= m_arrays->n) return std::optional<Element>();
        Element e;
        e.x = m_arrays->x.rows(m_i, m_i + 1).reshaped(m_arrays->xRow);
        if (m_arrays->y.defined()) e.y = m_arrays->y.rows(m_i, m_i + 1).reshaped(m_arrays->yRow);
        e.key = m_keyBase + static_cast<uint64_t>(m_i);
        e.origin = m_arrays->origin;
        e.labelOrigin = m_arrays->labelOrigin;
        if (e.origin) e.position = "row " + std::to_string(m_i);  // errors then say "'x.npy' row 3"
        ++m_i;
        m_counters->addBusy(nowNs() - t0);
        if (m_countProduced) m_counters->countProduced(e);
        return std::optional<Element>(std::move(e));
    }

    Result<bool> skip() override
    {
        if (m_ctx.chain->stopped()) return cancelledError();
        if (!m_arrays) TS_TRY(load());
        TS_TRY(passBadRows());
        if (m_i >= m_arrays->n) return false;
        ++m_i;
        return true;
    }

private:
    Status load()
    {
        const int64_t t0 = nowNs();
        auto a = m_load();
        m_counters->addBusy(nowNs() - t0);
        if (!a.ok()) return a.takeError();
        m_arrays = std::move(a).value();
        // Not finite somewhere: refused where it loads (before the first step), unless bad
        // records are dropped.
        if (!m_arrays->badRows.empty() && !m_ctx.shared->skipBad) return *nonFiniteRow(*m_arrays, m_arrays->badRows.front());
        return okStatus();
    }

    // Under skip_bad_records a row that is not finite is no element: dropped and counted here,
    // by next() and skip() alike, so positions agree across the tasks that pass over it.
    Status passBadRows()
    {
        const auto& bad = m_arrays->badRows;
        while (m_nextBad < bad.size() && bad[m_nextBad] < m_i) ++m_nextBad;
        while (m_nextBad < bad.size() && bad[m_nextBad] == m_i) {
            m_ctx.shared->recordBad(*nonFiniteRow(*m_arrays, m_i));
            m_counters->skipped.fetch_add(1, std::memory_order_relaxed);
            ++m_nextBad;
            ++m_i;
        }
        return okStatus();
    }

    std::size_t m_nextBad = 0;  // the first of m_arrays->badRows not passed yet

    Loader m_load;
    IterContext m_ctx;
    Counters* m_counters;
    bool m_countProduced;
    uint64_t m_keyBase;
    std::shared_ptr<const Arrays> m_arrays;
    int64_t m_i = 0;
};

// In-memory sources (idx, npy, a single npz, tensors): loaded once, kept for every epoch.
class ArraySourceStage final : public Stage {
public:
    explicit ArraySourceStage(SourceSpec spec) : Stage(sourceKindName(spec.kind), "source", false), m_spec(std::move(spec))
    {
        if (m_spec.kind == SourceKind::Tensors) m_count = m_spec.x.shape()[0];
    }

    Result<IteratorPtr> makeIterator(const IterContext& ctx) override
    {
        return IteratorPtr(new ArrayIterator([this] { return arrays(); }, ctx, &counters, true, 0));
    }
    int64_t cardinality() const override { return m_count.load(); }

private:
    Result<std::shared_ptr<const Arrays>> arrays()
    {
        std::lock_guard<std::mutex> lock(m_mutex);
        if (m_arrays) return m_arrays;
        Result<std::shared_ptr<const Arrays>> r = [&]() -> Result<std::shared_ptr<const Arrays>> {
            switch (m_spec.kind) {
            case SourceKind::Idx: return loadIdx(m_spec);
            case SourceKind::Npy: return loadNpy(m_spec);
            case SourceKind::Npz: return loadNpz(m_spec.paths[0], m_spec);
            case SourceKind::Tensors: return makeArrays(m_spec.x, m_spec.y, "", "from_tensor_slices");
            default: return makeError(ErrorCode::Internal, "not an array source");
            }
        }();
        if (r.ok()) {
            m_arrays = r.value();
            m_count = m_arrays->n;
        }
        return r;
    }

    SourceSpec m_spec;
    std::mutex m_mutex;
    std::shared_ptr<const Arrays> m_arrays;
    std::atomic<int64_t> m_count{kUnknownCardinality};
};

// One CSV file, streamed each epoch.
class CsvIterator final : public Iterator {
public:
    CsvIterator(std::string path, CsvOptions options, bool floatLabels, const IterContext& ctx, Counters* counters,
                bool countProduced, uint64_t fileIndex)
        : m_path(std::move(path)), m_options(std::move(options)), m_floatLabels(floatLabels), m_ctx(ctx), m_counters(counters),
          m_countProduced(countProduced), m_fileIndex(fileIndex)
    {
    }

    Next next() override
    {
        const int64_t t0 = nowNs();
        Next r = produce();
        m_counters->addBusy(nowNs() - t0);
        if (r.ok() && r->has_value() && m_countProduced) m_counters->countProduced(**r);
        return r;
    }

    // A line passed over unparsed is one record only when no bad line is dropped: with
    // skip_bad_records a bad line is no element, so it must be parsed to count positions right.
    Result<bool> skip() override
    {
        if (m_ctx.shared->skipBad) return Iterator::skip();
        if (m_ctx.chain->stopped()) return cancelledError();
        const int64_t t0 = nowNs();
        Status opened = open();
        Result<bool> r = opened.ok() ? m_reader->skip() : Result<bool>(opened.takeError());
        m_counters->addBusy(nowNs() - t0);
        return r;
    }

private:
    Status open()
    {
        if (!m_reader) {
            TS_ASSIGN(m_reader, CsvReader::open(m_path, m_options));
            m_origin = std::make_shared<const std::string>(m_path);
        }
        return okStatus();
    }

    Next produce()
    {
        TS_TRY(open());
        for (;;) {
            if (m_ctx.chain->stopped()) return cancelledError();
            auto rec = m_reader->next();
            if (!rec.ok()) {
                if (m_ctx.shared->skipBad && rec.error().code == ErrorCode::ParseError) {
                    m_ctx.shared->recordBad(rec.error());
                    m_counters->skipped.fetch_add(1, std::memory_order_relaxed);
                    continue;
                }
                return rec.takeError();
            }
            if (!rec->has_value()) return std::optional<Element>();
            const CsvRecord& r = **rec;
            Element e;
            TS_ASSIGN(e.x, Tensor::create(Shape{static_cast<int64_t>(r.features.size())}, DType::F32));
            std::memcpy(e.x.raw(), r.features.data(), r.features.size() * sizeof(float));
            if (m_floatLabels) {
                TS_ASSIGN(e.y, Tensor::create(Shape{1}, DType::F32));
                e.y.data<float>()[0] = r.label;
            } else {
                TS_ASSIGN(e.y, Tensor::create(Shape{}, DType::I32));
                e.y.data<int32_t>()[0] = static_cast<int32_t>(r.label);
            }
            e.key = (m_fileIndex << 40) | static_cast<uint64_t>(r.line);
            e.origin = m_origin;
            e.position = "line " + std::to_string(r.line);
            return std::optional<Element>(std::move(e));
        }
    }

    std::string m_path;
    CsvOptions m_options;
    bool m_floatLabels;
    IterContext m_ctx;
    Counters* m_counters;
    bool m_countProduced;
    uint64_t m_fileIndex;
    std::unique_ptr<CsvReader> m_reader;
    std::shared_ptr<const std::string> m_origin;
};

// Sources made of files (csv, npz): one file read straight through, or several interleaved.
class FileSourceStage final : public Stage {
public:
    FileSourceStage(SourceSpec spec, const TransformSpec* interleave, int cpuBudget)
        : Stage(std::string(sourceKindName(spec.kind)), "source", false), m_spec(std::move(spec))
    {
        const int64_t files = static_cast<int64_t>(m_spec.paths.size());
        if (interleave) {
            m_parallel = interleave->parallelism == kAutotune || interleave->parallelism > 1;
            m_cycle = interleave->cycleLength == kAutotune ? std::min<int64_t>(files, std::max(1, cpuBudget))
                                                           : interleave->cycleLength;
            m_cycle = std::max<int64_t>(1, std::min(m_cycle, files));
            m_block = interleave->blockLength;
            name = std::string(sourceKindName(m_spec.kind)) + " interleave(" + std::to_string(files) + " files, cycle " +
                   std::to_string(m_cycle) + ")";
            async = m_parallel && files > 1;
            if (async) counters.parallelism = static_cast<int>(m_cycle);
        } else if (files > 1) {
            name = std::string(sourceKindName(m_spec.kind)) + "(" + std::to_string(files) + " files)";
        }
        m_csv.labelColumn = m_spec.labelColumn;
        m_csv.featureColumns = m_spec.featureColumns;
        m_csv.delimiter = m_spec.delimiter;
        m_csv.floatLabels = m_spec.floatLabels;
    }

    Result<IteratorPtr> makeIterator(const IterContext& ctx) override
    {
        countOnce();
        TS_TRY(sameColumns());
        const bool single = m_spec.paths.size() == 1;
        auto factory = [this, ctx, single](std::size_t i) -> Result<IteratorPtr> {
            const std::string& path = m_spec.paths[i];
            if (m_spec.kind == SourceKind::Csv)
                return IteratorPtr(new CsvIterator(path, m_csv, m_spec.floatLabels, ctx, &counters, single, i));
            SourceSpec spec = m_spec;
            return IteratorPtr(new ArrayIterator([path, spec] { return loadNpz(path, spec); }, ctx, &counters, single,
                                                 static_cast<uint64_t>(i) << 40));
        };
        if (single) return factory(0);
        return makeInterleaveIterator(m_spec.paths.size(), factory, ctx, *this, m_cycle, m_block, async);
    }

    int64_t cardinality() const override { return m_count.load(); }

private:
    // Several CSV files are one dataset: each must have the first one's feature columns (by
    // name, in order), or their rows would be batched by position (a column 'extra' read as
    // the second feature) or fail later as a batch of the wrong shape naming no file.
    Status sameColumns()
    {
        if (m_spec.kind != SourceKind::Csv || m_spec.paths.size() < 2) return okStatus();
        std::lock_guard lock(m_columnsMutex);
        if (m_columnsChecked) return m_columns;
        m_columnsChecked = true;
        std::vector<std::string> first;
        for (std::size_t i = 0; i < m_spec.paths.size(); ++i) {
            auto r = CsvReader::open(m_spec.paths[i], m_csv);
            if (!r.ok()) return m_columns = r.takeError();
            if (i == 0) {
                first = (*r)->featureNames();
                continue;
            }
            if ((*r)->featureNames() == first) continue;
            auto list = [](const std::vector<std::string>& names) {
                std::string out;
                for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
                return "(" + out + ")";
            };
            return m_columns = makeError(ErrorCode::ParseError,
                                         "CSV files '" + m_spec.paths[0] + "' and '" + m_spec.paths[i] + "' have different feature columns: " +
                                             list(first) + " and " + list((*r)->featureNames()),
                                         "every file of one csv source needs the same columns; name the ones to read with "
                                         "\"feature_columns\", or give the files their own sources");
        }
        return m_columns;
    }

    void countOnce()
    {
        if (m_counted.exchange(true) || m_spec.kind != SourceKind::Csv) return;
        // CSV: count data lines once (cheap next to parsing), so the trainer can show progress.
        int64_t total = 0;
        for (const auto& p : m_spec.paths) {
            auto n = CsvReader::countRecords(p);
            if (!n.ok()) return;  // the real error surfaces when the file is read
            total += *n;
        }
        m_count = total;
    }

    SourceSpec m_spec;
    CsvOptions m_csv;
    bool m_parallel = false;
    int64_t m_cycle = 1, m_block = 1;
    std::atomic<bool> m_counted{false};
    std::atomic<int64_t> m_count{kUnknownCardinality};
    std::mutex m_columnsMutex;
    bool m_columnsChecked = false;
    Status m_columns = okStatus();
};

// Image folders: the listing is read once; elements carry the file (origin) and the label, and
// decode_image turns them into pixels.
class ImageListIterator final : public Iterator {
public:
    using Lister = std::function<Result<std::shared_ptr<const ImageFolderListing>>()>;
    ImageListIterator(Lister list, const IterContext& ctx, Counters* counters)
        : m_list(std::move(list)), m_ctx(ctx), m_counters(counters)
    {
    }
    Next next() override
    {
        if (m_ctx.chain->stopped()) return cancelledError();
        const int64_t t0 = nowNs();
        if (!m_listing) {
            auto l = m_list();
            m_counters->addBusy(nowNs() - t0);
            if (!l.ok()) return l.takeError();
            m_listing = std::move(l).value();
        }
        if (m_i >= m_listing->files.size()) return std::optional<Element>();
        const auto& f = m_listing->files[m_i];
        Element e;
        auto y = Tensor::create(Shape{}, DType::I32);
        if (!y.ok()) return y.takeError();
        e.y = std::move(y).value();
        e.y.data<int32_t>()[0] = f.label;
        e.key = m_i;
        e.origin = f.path;
        e.position = "image";
        ++m_i;
        m_counters->addBusy(nowNs() - t0);
        m_counters->countProduced(e);
        return std::optional<Element>(std::move(e));
    }

private:
    Lister m_list;
    IterContext m_ctx;
    Counters* m_counters;
    std::shared_ptr<const ImageFolderListing> m_listing;
    std::size_t m_i = 0;
};

class ImageFolderStage final : public Stage {
public:
    explicit ImageFolderStage(SourceSpec spec) : Stage("image_folder", "source", false), m_spec(std::move(spec)) {}

    Result<IteratorPtr> makeIterator(const IterContext& ctx) override
    {
        return IteratorPtr(new ImageListIterator([this] { return listing(); }, ctx, &counters));
    }
    int64_t cardinality() const override { return m_count.load(); }

private:
    Result<std::shared_ptr<const ImageFolderListing>> listing()
    {
        std::lock_guard<std::mutex> lock(m_mutex);
        if (m_listing) return m_listing;
        TS_ASSIGN(ImageFolderListing l, listImageFolder(m_spec.paths[0], m_spec.classNames));
        m_listing = std::make_shared<const ImageFolderListing>(std::move(l));
        m_count = static_cast<int64_t>(m_listing->files.size());
        return m_listing;
    }

    SourceSpec m_spec;
    std::mutex m_mutex;
    std::shared_ptr<const ImageFolderListing> m_listing;
    std::atomic<int64_t> m_count{kUnknownCardinality};
};

} // namespace

Result<std::unique_ptr<Stage>> makeSourceStage(const SourceSpec& spec, const TransformSpec* interleave, int cpuBudget)
{
    switch (spec.kind) {
    case SourceKind::Idx:
    case SourceKind::Npy:
    case SourceKind::Tensors: return std::unique_ptr<Stage>(new ArraySourceStage(spec));
    case SourceKind::Npz:
        if (spec.paths.size() == 1 && !interleave) return std::unique_ptr<Stage>(new ArraySourceStage(spec));
        return std::unique_ptr<Stage>(new FileSourceStage(spec, interleave, cpuBudget));
    case SourceKind::Csv: return std::unique_ptr<Stage>(new FileSourceStage(spec, interleave, cpuBudget));
    case SourceKind::ImageFolder: return std::unique_ptr<Stage>(new ImageFolderStage(spec));
    }
    return makeError(ErrorCode::Internal, "unknown source kind");
}

} // namespace ts::pipeline_detail
