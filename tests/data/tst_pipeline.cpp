// The tf.data-style input pipeline: every source (IDX, CSV, .npy/.npz, image folders, tensors)
// and transformation, seeds and determinism (also with parallel map), shard coverage, caches,
// interleave, cancellation under load, an error naming file and position for each kind of corrupt
// input, the stall accounting (a slow map is highly input-bound without parallelism and under 5%
// with AUTOTUNE), telemetry events, and the RunConfig "pipeline" section end to end.
// Fixtures are written to a temporary folder at run time.

#include <QTemporaryDir>
#include <QtTest>

#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <thread>

#include "data/auto_shard.h"
#include "data/autotune.h"
#include "data/csv.h"
#include "data/image_folder.h"
#include "data/npz.h"
#include "data/pipeline.h"
#include "data/transforms.h"
#include "io/npy.h"
#include "telemetry/bus.h"
#include "model/spec.h"
#include "train/run_config.h"
#include "train/trainer.h"

using namespace ts;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

bool contains(const std::string& haystack, const std::string& needle) { return haystack.find(needle) != std::string::npos; }

#define VERIFY_MSG(haystack, needle)                                                                                   \
    QVERIFY2(contains((haystack), (needle)),                                                                           \
             qPrintable(QString::fromStdString("'" + std::string(needle) + "' not in: " + (haystack))))
#define VERIFY_OK(expr)                                                                                                \
    do {                                                                                                               \
        const auto& ok_r_ = (expr);                                                                                    \
        QVERIFY2(ok_r_.ok(), ok_r_.ok() ? "" : ok_r_.error().toString().c_str());                                     \
    } while (0)

void writeBytes(const std::string& path, const std::string& bytes, bool gzip = false)
{
    if (gzip) {
        gzFile f = gzopen(path.c_str(), "wb");
        gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
        gzclose(f);
    } else {
        std::ofstream out(path, std::ios::binary);
        out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    }
}

std::string readBytes(const std::string& path)
{
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string idxBytes(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data)
{
    std::string s{'\0', '\0', '\x08', static_cast<char>(dims.size())};
    for (uint32_t d : dims)
        for (int sh : {24, 16, 8, 0}) s += static_cast<char>(d >> sh);
    s.append(reinterpret_cast<const char*>(data.data()), data.size());
    return s;
}

// x (n, 3) rows {i, i + 0.5, -i}, y (n) = i.
SourceSpec rows(int64_t n)
{
    Tensor x = Tensor::empty(Shape{n, 3});
    Tensor y = Tensor::empty(Shape{n}, DType::I32);
    for (int64_t i = 0; i < n; ++i) {
        x.data<float>()[i * 3 + 0] = float(i);
        x.data<float>()[i * 3 + 1] = float(i) + 0.5f;
        x.data<float>()[i * 3 + 2] = -float(i);
        y.data<int32_t>()[i] = int32_t(i);
    }
    return SourceSpec::fromTensorSlices(x, y);
}

std::unique_ptr<Pipeline> make(const PipelineSpec& spec, PipelineOptions options = {})
{
    auto r = Pipeline::create(spec, options);
    if (!r.ok()) qWarning("%s", r.error().toString().c_str());
    return r.ok() ? std::move(r).value() : nullptr;
}

// Every element of one epoch (batched or not); stops at the first error (returned in `error`).
std::vector<Element> drain(Pipeline& p, int64_t epoch, std::string* error = nullptr)
{
    std::vector<Element> out;
    if (error) error->clear();
    auto st = p.startEpoch(epoch);
    if (!st.ok()) {
        if (error) *error = st.error().toString();
        return out;
    }
    for (;;) {
        auto e = p.nextElement();
        if (!e.ok()) {
            if (error) *error = e.error().toString();
            break;
        }
        if (!e->has_value()) break;
        out.push_back(std::move(**e));
    }
    return out;
}

// The labels (i32) of elements in order, flattening batches.
std::vector<int32_t> labels(const std::vector<Element>& es)
{
    std::vector<int32_t> v;
    for (const auto& e : es)
        for (int64_t i = 0; i < e.y.numel(); ++i) v.push_back(e.y.data<int32_t>()[i]);
    return v;
}

std::vector<float> values(const Tensor& t)
{
    return t.toVector();
}

int threadCount()
{
    int n = 0;
    for (const auto& e : fs::directory_iterator("/proc/self/task")) {
        (void)e;
        ++n;
    }
    return n;
}

// Waits (briefly) until the thread count is back to `want`: the kernel reaps exited threads asynchronously.
bool threadsBackTo(int want)
{
    for (int i = 0; i < 100; ++i) {
        if (threadCount() <= want) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
}

MapFunction sleepFn(int ms)
{
    return customMapFn("slow", [ms](Element&& e, const MapContext&) -> Result<Element> {
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
        return std::move(e);
    });
}

// A PNG written by hand (libpng's writer would not make these): `rows` holds each row's raw
// bytes (no filter byte); `extra` chunks (type, data) go before IDAT.
std::string rawPng(uint32_t w, uint32_t h, uint8_t bitDepth, uint8_t colorType, const std::string& rows,
                   const std::vector<std::pair<std::string, std::string>>& extra = {})
{
    auto be32 = [](uint32_t v) {
        return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
    };
    auto chunk = [&](const std::string& type, const std::string& data) {
        const std::string td = type + data;
        const uLong crc = crc32(0L, reinterpret_cast<const Bytef*>(td.data()), static_cast<uInt>(td.size()));
        return be32(static_cast<uint32_t>(data.size())) + td + be32(static_cast<uint32_t>(crc));
    };
    const std::size_t rowBytes = rows.size() / h;
    std::string filtered;
    for (uint32_t y = 0; y < h; ++y) filtered += '\0' + rows.substr(y * rowBytes, rowBytes);
    std::string z(compressBound(static_cast<uLong>(filtered.size())), '\0');
    uLongf zn = static_cast<uLongf>(z.size());
    compress(reinterpret_cast<Bytef*>(z.data()), &zn, reinterpret_cast<const Bytef*>(filtered.data()), static_cast<uLong>(filtered.size()));
    z.resize(zn);
    std::string out = "\x89PNG\r\n\x1a\n";
    out += chunk("IHDR", be32(w) + be32(h) + std::string{static_cast<char>(bitDepth), static_cast<char>(colorType), 0, 0, 0});
    for (const auto& [type, data] : extra) out += chunk(type, data);
    return out + chunk("IDAT", z) + chunk("IEND", "");
}

Tensor image(int64_t h, int64_t w, int64_t c, uint8_t r, uint8_t g, uint8_t b)
{
    Tensor t = Tensor::empty(Shape{h, w, c}, DType::U8);
    const uint8_t rgb[3] = {r, g, b};
    for (int64_t i = 0; i < h * w; ++i)
        for (int64_t k = 0; k < c; ++k) t.data<uint8_t>()[i * c + k] = rgb[k % 3];
    return t;
}

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A training-like loop: `steps` batches, `computeMs` of "compute" after each; the window covers them.
PipelineWindow consume(Pipeline& p, int steps, int computeMs)
{
    if (!p.startEpoch(0).ok()) return {};
    const PipelineSnapshot start = p.snapshot();
    for (int s = 0; s < steps; ++s) {
        auto b = p.next();
        if (!b.ok() || !b->has_value()) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(computeMs));
    }
    (void)p.next();  // closes the last step
    return p.windowSince(start);
}

} // namespace

class TestPipeline : public QObject {
    Q_OBJECT

private:
    QTemporaryDir m_dir;
    std::string tmp(const std::string& name) const { return (fs::path(m_dir.path().toStdString()) / name).string(); }

private slots:
    void initTestCase() { QVERIFY(m_dir.isValid()); }

    // ---- configuration ------------------------------------------------------------------------

    void jsonRoundTrip()
    {
        const nlohmann::json j = nlohmann::json::parse(R"({
          "source": {"kind": "idx", "dir": "/data/fmnist", "split": "train", "layout": "image"},
          "transformations": [
            {"op": "shard", "num_shards": 2, "index": 1},
            {"op": "map", "fn": "normalise", "mean": [0.5], "std": [0.25], "num_parallel_calls": "AUTOTUNE"},
            {"op": "map", "fn": "random_crop", "size": [24, 24], "padding": 4, "seed": 9},
            {"op": "map", "fn": "random_flip", "mode": "horizontal"},
            {"op": "map", "fn": "one_hot", "depth": 10, "num_parallel_calls": 2, "deterministic": false},
            {"op": "cache", "file": "/tmp/c.bin"},
            {"op": "shuffle", "buffer_size": 1000, "seed": 3, "reshuffle_each_iteration": false},
            {"op": "repeat", "count": 2}, {"op": "skip", "count": 1}, {"op": "take", "count": 100},
            {"op": "batch", "size": 32, "drop_remainder": true},
            {"op": "prefetch", "buffer_size": "AUTOTUNE"}],
          "seed": 42, "deterministic": true, "skip_bad_records": true, "window_steps": 20,
          "autotune": {"enabled": true, "cpu_budget": 2, "ram_budget_mb": 512}})");
        auto spec = PipelineSpec::fromJson(j);
        VERIFY_OK(spec);
        QCOMPARE(spec->ops.size(), std::size_t(12));
        QCOMPARE(spec->ops[1].parallelism, kAutotune);
        QCOMPARE(spec->ops[4].deterministic.value_or(true), false);
        QCOMPARE(spec->batchSize(), int64_t(32));
        QCOMPARE(spec->autotune.ramBudgetBytes, int64_t(512) << 20);
        const nlohmann::json out = spec->toJson();
        auto again = PipelineSpec::fromJson(out);
        VERIFY_OK(again);
        QCOMPARE(again->toJson().dump(), out.dump());
        QCOMPARE(out["transformations"][11]["buffer_size"].get<std::string>(), std::string("AUTOTUNE"));

        // Errors name the place and the key.
        auto bad = [](const char* text) {
            auto r = PipelineSpec::fromJson(nlohmann::json::parse(text), "run.json: pipeline");
            return r.ok() ? std::string("OK") : r.error().toString();
        };
        const std::string typo = bad(R"({"source": {"kind": "idx", "dir": "d"}, "transformations": [{"op": "shuffle", "buffer_sz": 3}]})");
        VERIFY_MSG(typo, "run.json: pipeline.transformations[0]");
        VERIFY_MSG(typo, "buffer_sz");
        VERIFY_MSG(bad(R"({"source": {"kind": "idx", "dir": "d"}, "transformations": [{"op": "shard", "num_shards": 3, "index": 3}]})"),
                   "index: 3 is not in [0, 3)");
        VERIFY_MSG(bad(R"({"source": {"kind": "csv"}})"), "pipeline.source");
        // Budgets beyond any machine are named, not wrapped (5e9 cores) or overflowed (9e15 MB).
        VERIFY_MSG(bad(R"({"source": {"kind": "idx", "dir": "d"}, "autotune": {"cpu_budget": 5e9}})"), "pipeline.autotune.cpu_budget: expected 0");
        VERIFY_MSG(bad(R"({"source": {"kind": "idx", "dir": "d"}, "autotune": {"ram_budget_mb": 9e15}})"), "pipeline.autotune.ram_budget_mb: expected 0");
        VERIFY_MSG(bad(R"({"source": {"kind": "idx", "dir": "d"}, "autotune": {"ram_budget_mb": 1e300}})"), "pipeline.autotune.ram_budget_mb");
        VERIFY_MSG(bad(R"({"source": {"kind": "parquet"}})"), "unknown source kind \"parquet\"");
        VERIFY_MSG(bad(R"({"source": {"kind": "csv", "paths": ["a.csv"]}, "transformations": [{"op": "batch", "size": 2}, {"op": "interleave"}]})"),
                   "must come first");
        VERIFY_MSG(bad(R"({"source": {"kind": "idx", "dir": "d"}, "transformations": [{"op": "map", "fn": "sharpen"}]})"),
                   "unknown map function \"sharpen\"");
        VERIFY_MSG(bad(R"({"source": {"kind": "idx", "dir": "d"}, "transformations": [{"op": "map", "fn": "one_hot", "depht": 3}]})"),
                   "unknown parameter \"depht\"");
        VERIFY_MSG(bad(R"({"source": {"kind": "idx", "dir": "d"}, "transformations": [{"op": "prefetch", "buffer_size": "lots"}]})"),
                   "expected an integer or \"AUTOTUNE\"");
        // A number or boolean in quotes is the usual slip: the hint says so.
        VERIFY_MSG(bad(R"({"source": {"kind": "idx", "dir": "d"}, "transformations": [{"op": "batch", "size": "64"}]})"),
                   "write the number without quotes: \"size\": 64");
        VERIFY_MSG(bad(R"({"source": {"kind": "idx", "dir": "d"}, "deterministic": "false"})"),
                   "write it without quotes: \"deterministic\": false");
        const std::string longList = bad(R"({"source": {"kind": "idx", "dir": "d"}, "seed": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24]})");
        VERIFY_MSG(longList, "got [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22...");
        QVERIFY2(!contains(longList, "24]"), longList.c_str());
    }

    // ---- sources ------------------------------------------------------------------------------

    void tensorSlicesAndBatch()
    {
        auto p = make(PipelineSpec(rows(10)).batch(4));
        QVERIFY(p);
        QCOMPARE(p->batchesPerEpoch(), int64_t(3));
        QCOMPARE(p->examplesPerEpoch(), int64_t(10));
        VERIFY_OK(p->startEpoch(0));
        std::vector<int64_t> sizes;
        for (;;) {
            auto b = p->next();
            VERIFY_OK(b);
            if (!b->has_value()) break;
            const Batch& batch = **b;
            sizes.push_back(batch.size());
            QCOMPARE(batch.x.dtype(), DType::F32);
            QCOMPARE(batch.x.shape()[1], int64_t(3));
            for (int64_t i = 0; i < batch.size(); ++i) {
                const int32_t label = batch.y.data<int32_t>()[i];
                QCOMPARE(batch.x.data<float>()[i * 3 + 1], float(label) + 0.5f);
            }
        }
        QCOMPARE(sizes, (std::vector<int64_t>{4, 4, 2}));
        auto again = p->next();  // stays at the end until the next epoch
        VERIFY_OK(again);
        QVERIFY(!again->has_value());

        auto drop = make(PipelineSpec(rows(10)).batch(4, true));
        QCOMPARE(drop->batchesPerEpoch(), int64_t(2));
        QCOMPARE(drain(*drop, 0).size(), std::size_t(2));

        // Without batch(), next() says what to add; nextElement() serves single elements.
        auto single = make(PipelineSpec(rows(3)));
        auto nb = single->next();
        QVERIFY(!nb.ok());
        VERIFY_MSG(nb.error().hint, "batch");
        QCOMPARE(labels(drain(*single, 0)), (std::vector<int32_t>{0, 1, 2}));
    }

    void idxSource()
    {
        // 5 images of 4x4, pixel = 10 * image + position; labels 4 - i.
        std::vector<uint8_t> px(5 * 16), lab(5);
        for (int i = 0; i < 5; ++i) {
            for (int k = 0; k < 16; ++k) px[std::size_t(i * 16 + k)] = uint8_t(10 * i + k);
            lab[std::size_t(i)] = uint8_t(4 - i);
        }
        fs::create_directories(tmp("idx"));
        writeBytes(tmp("idx/train-images-idx3-ubyte.gz"), idxBytes({5, 4, 4}, px), true);
        writeBytes(tmp("idx/train-labels-idx1-ubyte"), idxBytes({5}, lab));
        auto p = make(PipelineSpec(SourceSpec::idxDir(tmp("idx"))).map(normaliseFn()).batch(2));
        QVERIFY(p);
        auto es = drain(*p, 0);
        QCOMPARE(es.size(), std::size_t(3));
        QCOMPARE(es[0].x.shape(), (Shape{2, 16}));
        QCOMPARE(es[0].x.dtype(), DType::F32);
        QCOMPARE(es[1].x.data<float>()[16 + 3], float(10 * 3 + 3) / 255.f);
        QCOMPARE(labels(es), (std::vector<int32_t>{4, 3, 2, 1, 0}));
        QCOMPARE(p->batchesPerEpoch(), int64_t(3));

        auto img = make(PipelineSpec(SourceSpec::idxFiles(tmp("idx/train-images-idx3-ubyte.gz"), tmp("idx/train-labels-idx1-ubyte"), "image")));
        auto one = drain(*img, 0);
        QCOMPARE(one.size(), std::size_t(5));
        QCOMPARE(one[0].x.shape(), (Shape{4, 4, 1}));
        QCOMPARE(one[0].x.dtype(), DType::U8);
    }

    void idxCorrupt()
    {
        writeBytes(tmp("labels5.idx"), idxBytes({5}, std::vector<uint8_t>(5, 1)));
        std::string wrongMagic = idxBytes({5, 4, 4}, std::vector<uint8_t>(80, 7));
        wrongMagic[0] = '\x42';
        writeBytes(tmp("magic.idx"), wrongMagic);
        writeBytes(tmp("short.idx"), idxBytes({5, 4, 4}, std::vector<uint8_t>(10, 7)));

        for (auto [file, needle] : {std::pair{"magic.idx", "wrong magic"}, std::pair{"short.idx", "truncated"}}) {
            auto p = make(PipelineSpec(SourceSpec::idxFiles(tmp(file), tmp("labels5.idx"))).map(normaliseFn(), kAutotune).batch(2).prefetch());
            QVERIFY(p);  // nothing is read at create time
            std::string err;
            auto es = drain(*p, 0, &err);
            QVERIFY(es.empty());
            VERIFY_MSG(err, tmp(file));
            VERIFY_MSG(err, needle);
            // The error sticks until the next epoch.
            auto again = p->next();
            QVERIFY(!again.ok());
        }
        std::string err;
        auto p = make(PipelineSpec(SourceSpec::idxFiles(tmp("short.idx"), tmp("labels5.idx"))));
        drain(*p, 0, &err);
        VERIFY_MSG(err, "expected 80 bytes of data, found 10");
    }

    void csvSource()
    {
        writeBytes(tmp("a.csv"), "a,\"b\",label,c\n1,2,0,3\n\n4.5,-5e-1,2,6\r\n\"7\",8,1,9\n");
        SourceSpec s = SourceSpec::csv({tmp("a.csv")}, "label");
        auto p = make(PipelineSpec(s).batch(3));
        QVERIFY(p);
        auto es = drain(*p, 0);
        QCOMPARE(es.size(), std::size_t(1));
        QCOMPARE(values(es[0].x), (std::vector<float>{1, 2, 3, 4.5f, -0.5f, 6, 7, 8, 9}));
        QCOMPARE(labels(es), (std::vector<int32_t>{0, 2, 1}));
        QCOMPARE(p->examplesPerEpoch(), int64_t(3));

        s.featureColumns = {"c", "a"};
        auto sub = make(PipelineSpec(s));
        auto one = drain(*sub, 0);
        QCOMPARE(values(one[1].x), (std::vector<float>{6, 4.5f}));
        QCOMPARE(one[1].where(), "'" + tmp("a.csv") + "' line 4");

        s.featureColumns = {};
        s.labelColumn = "species";
        std::string err;
        drain(*make(PipelineSpec(s)), 0, &err);
        VERIFY_MSG(err, "no label column 'species'");
        VERIFY_MSG(err, "columns: a, b, label, c");
    }

    void csvErrors()
    {
        writeBytes(tmp("bad.csv"), "a,b,label\n1,2,0\n3,4\n5,abc,1\n6,7,1\n8,9,2.5\n");
        SourceSpec s = SourceSpec::csv({tmp("bad.csv")}, "label");
        std::string err;
        auto got = drain(*make(PipelineSpec(s)), 0, &err);
        QCOMPARE(got.size(), std::size_t(1));
        VERIFY_MSG(err, "CSV file '" + tmp("bad.csv") + "' line 3: ragged row with 2 fields; the header has 3");

        writeBytes(tmp("bad2.csv"), "a,b,label\n5,abc,1\n");
        drain(*make(PipelineSpec(SourceSpec::csv({tmp("bad2.csv")}, "label"))), 0, &err);
        VERIFY_MSG(err, "line 2, column 2 ('b'): 'abc' is not a number");
        // Lines ended by CR alone read as one line ("no label column 'label'" listing
        // "label\x0d0"); a folder is no CSV file (it was "empty").
        writeBytes(tmp("cr.csv"), "a,label\r1,0\r2,1\r");
        drain(*make(PipelineSpec(SourceSpec::csv({tmp("cr.csv")}, "label"))), 0, &err);
        VERIFY_MSG(err, "CSV file '" + tmp("cr.csv") + "' ends its lines with a carriage return (CR) alone");
        // A file of a header only: the empty first batch names it.
        writeBytes(tmp("header_only.csv"), "a,label\n");
        {
            PipelineSpec headerOnly(SourceSpec::csv({tmp("header_only.csv")}, "label"));
            headerOnly.batch(2);
            auto peeked = make(headerOnly)->peek();
            QVERIFY(!peeked.ok());
            VERIFY_MSG(peeked.error().message, "the input pipeline produced no batch");
            VERIFY_MSG(peeked.error().hint, "'" + tmp("header_only.csv") + "' gave no element to batch");
        }
        fs::create_directories(tmp("csv_folder"));
        drain(*make(PipelineSpec(SourceSpec::csv({tmp("csv_folder")}, "label"))), 0, &err);
        VERIFY_MSG(err, "'" + tmp("csv_folder") + "' is a folder, not a CSV file");
        // A header split by another separator than the delimiter: said as such, not as a 5 KB column name.
        {
            SourceSpec semi = SourceSpec::csv({tmp("bad2.csv")}, "label");
            semi.delimiter = ';';
            drain(*make(PipelineSpec(semi)), 0, &err);
            VERIFY_MSG(err, "its header is one column, split by ',' rather than by the delimiter ';'");
        }
        // NaN and Inf are no data to train on (a NaN feature turned the weights to NaN silently).
        for (const char* value : {"nan", "-inf", "1e999", "NaN"}) {
            writeBytes(tmp("nonfinite.csv"), std::string("a,b,label\n1,2,0\n3,") + value + ",1\n");
            got = drain(*make(PipelineSpec(SourceSpec::csv({tmp("nonfinite.csv")}, "label"))), 0, &err);
            QCOMPARE(got.size(), std::size_t(1));
            VERIFY_MSG(err, std::string("line 3, column 2 ('b'): '") + value + "' is not a finite number");
        }
        // File text in messages is escaped; a header of control bytes or other encodings is no CSV.
        writeBytes(tmp("esc_value.csv"), "a,label\n\x1b[31m,1\n");
        drain(*make(PipelineSpec(SourceSpec::csv({tmp("esc_value.csv")}, "label"))), 0, &err);
        VERIFY_MSG(err, "'\\x1b[31m' is not a number");
        writeBytes(tmp("esc_header.csv"), "\x1b]0;title\x07a,label\n1,2\n");
        drain(*make(PipelineSpec(SourceSpec::csv({tmp("esc_header.csv")}, "label"))), 0, &err);
        VERIFY_MSG(err, "line 1: the header holds the control byte 0x1b at byte 1, so this is not a CSV text file");
        writeBytes(tmp("latin1.csv"), "temp\xe9rature,label\n1,2\n");
        drain(*make(PipelineSpec(SourceSpec::csv({tmp("latin1.csv")}, "label"))), 0, &err);
        VERIFY_MSG(err, "the header is not UTF-8 text");
        std::string wide = "label";
        for (int k = 0; k < 30; ++k) wide += ",c" + std::to_string(k);
        writeBytes(tmp("wide.csv"), wide + "\n");
        drain(*make(PipelineSpec(SourceSpec::csv({tmp("wide.csv")}, "species"))), 0, &err);
        VERIFY_MSG(err, "c18, ... (31 columns)");

        // skip_bad_records: drop and count, keep going. A peek (the run's check of the first
        // batch before training) reads them too, but does not count them.
        PipelineSpec skip(s);
        skip.skipBadRecords = true;
        skip.ops.push_back(TransformSpec::batch(8));
        auto p = make(skip);
        QVERIFY(p->peek().ok());
        QCOMPARE(p->badRecords(), int64_t(0));
        QVERIFY(p->badRecordMessages().empty());
        auto kept = drain(*p, 0, &err);
        QCOMPARE(labels(kept), (std::vector<int32_t>{0, 1}));
        QCOMPARE(p->badRecords(), int64_t(3));
        const auto msgs = p->badRecordMessages();
        QCOMPARE(msgs.size(), std::size_t(3));
        VERIFY_MSG(msgs[0], "line 3");
        VERIFY_MSG(msgs[1], "line 4, column 2 ('b')");
        VERIFY_MSG(msgs[2], "line 6, column 3 ('label'): label '2.5' is not a class id");
        QCOMPARE(p->snapshot().stages[0].skipped, int64_t(3));
    }

    void npyAndNpz()
    {
        Tensor x = Tensor::empty(Shape{6, 2, 2});
        Tensor y = Tensor::empty(Shape{6}, DType::I32);
        for (int i = 0; i < 24; ++i) x.data<float>()[i] = float(i);
        for (int i = 0; i < 6; ++i) y.data<int32_t>()[i] = i % 3;
        VERIFY_OK(writeNpy(tmp("x.npy"), x));
        VERIFY_OK(writeNpy(tmp("y.npy"), y));
        auto p = make(PipelineSpec(SourceSpec::npy(tmp("x.npy"), tmp("y.npy"))).batch(4));
        auto es = drain(*p, 0);
        QCOMPARE(es.size(), std::size_t(2));
        QCOMPARE(es[0].x.shape(), (Shape{4, 2, 2}));
        QCOMPARE(es[1].x.data<float>()[0], 16.f);
        QCOMPARE(labels(es), (std::vector<int32_t>{0, 1, 2, 0, 1, 2}));

        // .npz: stored members; Keras-style x_train / y_train found without naming them.
        Tensor yu8 = Tensor::empty(Shape{6}, DType::U8);
        for (int i = 0; i < 6; ++i) yu8.data<uint8_t>()[i] = uint8_t(5 - i);
        VERIFY_OK(writeNpz(tmp("d.npz"), {{"x_train", x}, {"y_train", yu8}}));
        auto names = listNpz(tmp("d.npz"));
        VERIFY_OK(names);
        QCOMPARE(*names, (std::vector<std::string>{"x_train", "y_train"}));
        auto z = make(PipelineSpec(SourceSpec::npz({tmp("d.npz")})));
        auto zs = drain(*z, 0);
        QCOMPARE(zs.size(), std::size_t(6));
        QCOMPARE(values(zs[2].x), (std::vector<float>{8, 9, 10, 11}));
        QCOMPARE(zs[2].y.dtype(), DType::I32);
        QCOMPARE(labels(zs), (std::vector<int32_t>{5, 4, 3, 2, 1, 0}));

        // A deflated archive written by Python's zipfile (numpy.savez_compressed) when available.
        if (std::system("python3 -c 'import numpy' >/dev/null 2>&1") == 0) {
            const std::string cmd = "python3 -c \"import numpy as n; n.savez_compressed('" + tmp("c.npz") +
                                    "', x=n.arange(12, dtype=n.float64).reshape(3, 4), y=n.array([1, 0, 1], dtype=n.int64))\"";
            QCOMPARE(std::system(cmd.c_str()), 0);
            auto c = make(PipelineSpec(SourceSpec::npz({tmp("c.npz")})).batch(3));
            auto cs = drain(*c, 0);
            QCOMPARE(cs.size(), std::size_t(1));
            QCOMPARE(cs[0].x.dtype(), DType::F32);
            QCOMPARE(cs[0].x.data<float>()[11], 11.f);
            QCOMPARE(labels(cs), (std::vector<int32_t>{1, 0, 1}));
        }
    }

    void npzCorrupt()
    {
        Tensor x = Tensor::zeros(Shape{5, 2});
        Tensor y = Tensor::zeros(Shape{4}, DType::I32);
        VERIFY_OK(writeNpz(tmp("mismatch.npz"), {{"x", x}, {"y", y}}));
        std::string err;
        drain(*make(PipelineSpec(SourceSpec::npz({tmp("mismatch.npz")}))), 0, &err);
        VERIFY_MSG(err, ".npz file '" + tmp("mismatch.npz") + "' is mismatched");
        VERIFY_MSG(err, "(5, 2)");

        drain(*make(PipelineSpec(SourceSpec::npz({tmp("mismatch.npz")}, "features", "y"))), 0, &err);
        VERIFY_MSG(err, "has no array 'features'");
        VERIFY_MSG(err, "arrays present: x, y");
        QVERIFY2(!contains(err, "x_key"), err.c_str());  // the names were given: no advice on giving them
        VERIFY_OK(writeNpz(tmp("named.npz"), {{"feats", x}, {"labels", y}}));
        drain(*make(PipelineSpec(SourceSpec::npz({tmp("named.npz")}))), 0, &err);
        VERIFY_MSG(err, "has no array 'x'");
        VERIFY_MSG(err, "arrays present: feats, labels; name the features and labels with the source's \"x_key\" and \"y_key\"");

        writeBytes(tmp("junk.npz"), "this is not a zip archive at all");
        drain(*make(PipelineSpec(SourceSpec::npz({tmp("junk.npz")}))), 0, &err);
        VERIFY_MSG(err, "'" + tmp("junk.npz") + "' is not a readable .npz");

        // A member whose .npy header is damaged: the message names archive[member].
        const std::string good = readBytes(tmp("mismatch.npz"));
        std::string broken = good;
        const std::size_t at = broken.find("\x93NUMPY");
        QVERIFY(at != std::string::npos);
        broken[at + 1] = 'X';
        writeBytes(tmp("broken.npz"), broken);
        drain(*make(PipelineSpec(SourceSpec::npz({tmp("broken.npz")}))), 0, &err);
        VERIFY_MSG(err, tmp("broken.npz") + "[x.npy]");

        // NaN or inf in the arrays is refused where they load, naming the row (it would reach the
        // weights in one step, and a ReLU can hide it from the loss).
        Tensor nanX = Tensor::zeros(Shape{4, 3});
        nanX.data<float>()[2 * 3 + 1] = std::nanf("");
        VERIFY_OK(writeNpz(tmp("nan.npz"), {{"x", nanX}, {"y", Tensor::zeros(Shape{4}, DType::I32)}}));
        drain(*make(PipelineSpec(SourceSpec::npz({tmp("nan.npz")}))), 0, &err);
        VERIFY_MSG(err, ".npz file '" + tmp("nan.npz") + "': the features hold NaN at row 2 (value 1 of 3)");
        VERIFY_MSG(err, "np.isfinite");
        Tensor infY = Tensor::zeros(Shape{4});
        infY.data<float>()[3] = -std::numeric_limits<float>::infinity();
        VERIFY_OK(writeNpy(tmp("fin_x.npy"), Tensor::zeros(Shape{4, 3})));
        VERIFY_OK(writeNpy(tmp("inf_y.npy"), infY));
        drain(*make(PipelineSpec(SourceSpec::npy(tmp("fin_x.npy"), tmp("inf_y.npy")))), 0, &err);
        VERIFY_MSG(err, "'" + tmp("inf_y.npy") + "': the labels hold -inf at row 3");  // the labels' file, not the features'
        QVERIFY2(!contains(err, "(value"), err.c_str());  // one value per row: no position in it
        // With skip_bad_records such rows are bad records like a CSV line's: dropped and counted
        // (the whole array was refused), in next() and in a shard's pass over them alike.
        {
            Tensor x = Tensor::zeros(Shape{6, 2});
            for (int i = 0; i < 6; ++i) x.data<float>()[i * 2] = float(i);
            x.data<float>()[1 * 2 + 1] = std::numeric_limits<float>::quiet_NaN();
            x.data<float>()[4 * 2] = std::numeric_limits<float>::infinity();
            Tensor y = Tensor::zeros(Shape{6});
            y.data<float>()[2] = std::numeric_limits<float>::quiet_NaN();
            VERIFY_OK(writeNpy(tmp("holes_x.npy"), x));
            VERIFY_OK(writeNpy(tmp("holes_y.npy"), y));
            PipelineSpec skipping(SourceSpec::npy(tmp("holes_x.npy"), tmp("holes_y.npy")));
            skipping.skipBadRecords = true;
            auto p = make(skipping);
            std::vector<int> kept;
            for (const auto& e : drain(*p, 0)) kept.push_back(int(e.x.data<float>()[0]));
            QCOMPARE(kept, (std::vector<int>{0, 3, 5}));
            QCOMPARE(p->badRecords(), int64_t(3));
            PipelineSpec sharded(SourceSpec::npy(tmp("holes_x.npy"), tmp("holes_y.npy")));
            sharded.skipBadRecords = true;
            sharded.shard(2, 1);
            kept.clear();
            for (const auto& e : drain(*make(sharded), 0)) kept.push_back(int(e.x.data<float>()[0]));
            QCOMPARE(kept, (std::vector<int>{3}));  // the good rows 0, 3, 5: shard 1 of 2 takes 3
            // Without it the first bad row (of either file) fails the source where it loads.
            drain(*make(PipelineSpec(SourceSpec::npy(tmp("holes_x.npy"), tmp("holes_y.npy")))), 0, &err);
            VERIFY_MSG(err, "'" + tmp("holes_x.npy") + "': the features hold NaN at row 1 (value 1 of 2)");
        }
    }

    void imageFolder()
    {
        const std::string root = tmp("images");
        fs::create_directories(root + "/cat");
        fs::create_directories(root + "/dog");
        VERIFY_OK(writePng(root + "/cat/a.png", image(10, 12, 3, 200, 10, 10)));
        VERIFY_OK(writeJpeg(root + "/cat/b.jpg", image(16, 16, 3, 20, 200, 20), 95));
        VERIFY_OK(writePng(root + "/dog/c.PNG", image(6, 6, 1, 90, 90, 90)));
        writeBytes(root + "/dog/notes.txt", "ignored");

        auto listing = listImageFolder(root);
        VERIFY_OK(listing);
        QCOMPARE(listing->classNames, (std::vector<std::string>{"cat", "dog"}));
        QCOMPARE(listing->files.size(), std::size_t(3));

        // As Keras: a hidden folder is no class (an empty .ipynb_checkpoints shifted every label),
        // images in a class folder's sub-folders are that class's, and class_names name each
        // class once (a duplicate read its images twice, with two labels).
        {
            const std::string keras = tmp("keras_images");
            fs::create_directories(keras + "/.ipynb_checkpoints");
            fs::create_directories(keras + "/k0/sub/deeper");
            fs::create_directories(keras + "/k1");
            VERIFY_OK(writePng(keras + "/k0/a.png", image(2, 2, 1, 1, 1, 1)));
            VERIFY_OK(writePng(keras + "/k0/sub/b.png", image(2, 2, 1, 1, 1, 1)));
            VERIFY_OK(writePng(keras + "/k0/sub/deeper/c.png", image(2, 2, 1, 1, 1, 1)));
            VERIFY_OK(writePng(keras + "/k1/d.png", image(2, 2, 1, 1, 1, 1)));
            VERIFY_OK(writePng(keras + "/k0/z.png", image(2, 2, 1, 1, 1, 1)));  // Keras: k0's own files before its sub-folders
            auto k = listImageFolder(keras);
            VERIFY_OK(k);
            QCOMPARE(k->classNames, (std::vector<std::string>{"k0", "k1"}));
            std::vector<std::pair<std::string, int32_t>> got;
            for (const auto& f : k->files) got.emplace_back(fs::path(*f.path).filename().string(), f.label);
            QCOMPARE(got, (std::vector<std::pair<std::string, int32_t>>{{"a.png", 0}, {"z.png", 0}, {"b.png", 0}, {"c.png", 0}, {"d.png", 1}}));
            auto twice = listImageFolder(keras, {"k0", "k1", "k0"});
            QVERIFY(!twice.ok());
            VERIFY_MSG(twice.error().message, "class_names lists 'k0' twice");
        }

        PipelineSpec spec(SourceSpec::imageFolder(root, 8, 8, 3));
        spec.batch(3);
        auto p = make(spec);
        QVERIFY(p);
        QCOMPARE(p->stageNames()[1], std::string("map(decode_image, AUTOTUNE)"));  // inserted after the source
        auto es = drain(*p, 0);
        QCOMPARE(es.size(), std::size_t(1));
        const Tensor& b = es[0].x;
        QCOMPARE(b.shape(), (Shape{3, 8, 8, 3}));
        QCOMPARE(b.dtype(), DType::U8);
        QCOMPARE(labels(es), (std::vector<int32_t>{0, 0, 1}));
        const uint8_t* px = b.data<uint8_t>();
        QCOMPARE(int(px[0]), 200);                         // PNG red, resized
        QVERIFY(std::abs(int(px[8 * 8 * 3 + 1]) - 200) <= 3);  // JPEG green (lossy)
        QCOMPARE(int(px[2 * 8 * 8 * 3 + 5]), 90);          // grey PNG replicated to RGB

        // Grey output, and augmentation on decoded images.
        PipelineSpec grey(SourceSpec::imageFolder(root, 6, 6, 1));
        grey.map(randomFlipFn(), 2).map(randomCropFn(4, 4, 1)).map(normaliseFn()).batch(3);
        auto g = make(grey);
        auto gs = drain(*g, 0);
        QCOMPARE(gs[0].x.shape(), (Shape{3, 4, 4, 1}));
        QCOMPARE(gs[0].x.dtype(), DType::F32);
    }

    void imageCorrupt()
    {
        const std::string root = tmp("badimages");
        fs::create_directories(root + "/a");
        VERIFY_OK(writePng(root + "/a/0good.png", image(4, 4, 3, 1, 2, 3)));
        writeBytes(root + "/a/1text.png", "definitely not pixels");
        VERIFY_OK(writePng(tmp("full.png"), image(32, 32, 3, 9, 9, 9)));
        VERIFY_OK(writeJpeg(tmp("full.jpg"), image(32, 32, 3, 9, 9, 9)));
        const std::string png = readBytes(tmp("full.png"));
        const std::string jpg = readBytes(tmp("full.jpg"));
        writeBytes(root + "/a/2cut.png", png.substr(0, png.size() / 2));
        writeBytes(root + "/a/3cut.jpg", jpg.substr(0, jpg.size() / 2));

        auto decodeErr = [](const std::string& path) {
            auto r = decodeImageFile(path, 4, 4, 3);
            return r.ok() ? std::string("OK") : r.error().toString();
        };
        VERIFY_MSG(decodeErr(root + "/a/1text.png"), "'" + root + "/a/1text.png' is neither a PNG nor a JPEG");
        VERIFY_MSG(decodeErr(root + "/a/2cut.png"), "cannot decode PNG image '" + root + "/a/2cut.png'");
        VERIFY_MSG(decodeErr(root + "/a/3cut.jpg"), "cannot decode JPEG image '" + root + "/a/3cut.jpg'");

        // The file's values, as tf.io.decode_png gives them: 16-bit channels cut to their high
        // byte and no gamma conversion (the simplified libpng API gave 167 for these 100s),
        // alpha dropped rather than composited over black (it gave 72 for 100 at alpha 128).
        auto pixels = [](const std::string& png, int channels) {
            auto r = decodeImage(reinterpret_cast<const uint8_t*>(png.data()), png.size(), "t.png", 0, 0, channels);
            if (!r.ok()) qFatal("%s", r.error().toString().c_str());
            const auto* p = r->data<uint8_t>();
            return std::vector<int>(p, p + r->numel());
        };
        const std::string grey16 = rawPng(2, 1, 16, 0, std::string("\x64\x64\xc8\x00", 4));  // 25700, 51200
        QCOMPARE(pixels(grey16, 1), (std::vector<int>{100, 200}));
        QCOMPARE(pixels(grey16, 3), (std::vector<int>{100, 100, 100, 200, 200, 200}));
        const std::string gamma = rawPng(1, 1, 8, 0, "\x64", {{"gAMA", std::string("\x00\x01\x86\xa0", 4)}});  // gamma 1.0
        QCOMPARE(pixels(gamma, 1), (std::vector<int>{100}));
        const std::string rgba = rawPng(1, 1, 8, 6, std::string("\x64\x32\x0a\x80", 4));  // (100, 50, 10), alpha 128
        QCOMPARE(pixels(rgba, 3), (std::vector<int>{100, 50, 10}));
        QCOMPARE(pixels(rgba, 1), (std::vector<int>{60}));  // 0.299 * 100 + 0.587 * 50 + 0.114 * 10 = 60.4
        const std::string palette = rawPng(2, 1, 8, 3, std::string("\x01\x00", 2), {{"PLTE", std::string("\x0a\x14\x1e\x28\x32\x3c", 6)}});
        QCOMPARE(pixels(palette, 3), (std::vector<int>{40, 50, 60, 10, 20, 30}));
        const std::string twoBit = rawPng(4, 1, 2, 0, std::string("\x1b", 1));  // 0, 1, 2, 3 of 3
        QCOMPARE(pixels(twoBit, 1), (std::vector<int>{0, 85, 170, 255}));

        // Through a (parallel) pipeline: the first bad file stops the epoch, named.
        PipelineSpec spec(SourceSpec::imageFolder(root, 4, 4, 3));
        spec.batch(1).prefetch(2);
        std::string err;
        auto es = drain(*make(spec), 0, &err);
        QCOMPARE(es.size(), std::size_t(1));
        VERIFY_MSG(err, "map(decode_image, AUTOTUNE): '" + root + "/a/1text.png' image");

        spec.skipBadRecords = true;
        auto p = make(spec);
        es = drain(*p, 0, &err);
        QCOMPARE(es.size(), std::size_t(1));
        QCOMPARE(p->badRecords(), int64_t(3));
        QCOMPARE(p->snapshot().stages[1].skipped, int64_t(3));
    }

    // ---- transformations ----------------------------------------------------------------------

    void builtinFunctions()
    {
        MapContext ctx{7, 0};
        auto apply = [&](const MapFunction& f, Element e) { return f.fn(std::move(e), ctx); };

        Element e;
        e.x = Tensor::empty(Shape{2, 1, 3});
        for (int i = 0; i < 6; ++i) e.x.data<float>()[i] = float(i);
        auto n = apply(normaliseFn(1.f, {1, 2, 3}, {1, 2, 4}), e);
        VERIFY_OK(n);
        QCOMPARE(values(n->x), (std::vector<float>{-1, -0.5f, -0.25f, 2, 1, 0.5f}));
        QCOMPARE(values(e.x)[1], 1.f);  // the input is untouched
        auto wrongChannels = apply(normaliseFn(1.f, {1, 2}), e);
        QVERIFY(!wrongChannels.ok());

        Element l;
        l.y = Tensor::empty(Shape{}, DType::I32);
        l.y.data<int32_t>()[0] = 2;
        l.key = 11;
        auto oh = apply(oneHotFn(4), l);
        VERIFY_OK(oh);
        QCOMPARE(values(oh->y), (std::vector<float>{0, 0, 1, 0}));
        l.y.data<int32_t>()[0] = 5;
        auto out = apply(oneHotFn(4), l);
        QVERIFY(!out.ok());
        VERIFY_MSG(out.error().message, "element 11: one_hot: label 5 is outside [0, 4)");

        // random_flip: a pure function of (seed, epoch, key); about half the elements flip.
        Element img;
        img.x = Tensor::empty(Shape{2, 3, 1}, DType::U8);
        for (int i = 0; i < 6; ++i) img.x.data<uint8_t>()[i] = uint8_t(i);
        int flipped = 0;
        for (uint64_t key = 0; key < 64; ++key) {
            img.key = key;
            auto a = apply(randomFlipFn(), img);
            auto b = apply(randomFlipFn(), img);
            VERIFY_OK(a);
            QCOMPARE(values(a->x), values(b->x));
            if (a->x.data<uint8_t>()[0] == 2) {
                ++flipped;
                QCOMPARE(values(a->x), (std::vector<float>{2, 1, 0, 5, 4, 3}));
            }
        }
        QVERIFY2(flipped > 16 && flipped < 48, qPrintable(QString::number(flipped)));

        // random_crop without padding: a window of the source; with padding: zeros or source values.
        Element big;
        big.x = Tensor::empty(Shape{4, 4, 1}, DType::U8);
        for (int i = 0; i < 16; ++i) big.x.data<uint8_t>()[i] = uint8_t(i + 1);
        std::set<int> origins;
        for (uint64_t key = 0; key < 40; ++key) {
            big.key = key;
            auto c = apply(randomCropFn(2, 2, 0), big);
            VERIFY_OK(c);
            const uint8_t* p = c->x.data<uint8_t>();
            QCOMPARE(int(p[1]), p[0] + 1);
            QCOMPARE(int(p[2]), p[0] + 4);
            origins.insert(p[0]);
            auto padded = apply(randomCropFn(4, 4, 2), big);
            VERIFY_OK(padded);
            QCOMPARE(padded->x.shape(), (Shape{4, 4, 1}));
        }
        QVERIFY(origins.size() >= 5);  // several offsets drawn
        auto tooBig = apply(randomCropFn(9, 9, 2), big);
        QVERIFY(!tooBig.ok());
        VERIFY_MSG(tooBig.error().message, "does not fit the 8x8 padded image");
        auto flat = apply(randomFlipFn(), l);
        QVERIFY(!flat.ok());

        Element c;
        c.x = Tensor::fromVector(Shape{3}, {-3.f, 7.4f, 300.f});
        auto u8 = apply(castFn(DType::U8), c);
        QCOMPARE(values(u8->x), (std::vector<float>{0, 7, 255}));
        auto r = apply(reshapeFn({-1, 1}), c);
        QCOMPARE(r->x.shape(), (Shape{3, 1}));

        auto unknown = builtinMapFunction("blur", nlohmann::json::object(), "t");
        QVERIFY(!unknown.ok());
        VERIFY_MSG(unknown.error().hint, "normalise");
        auto zeroStd = builtinMapFunction("normalise", {{"std", 0}}, "t");
        QVERIFY(!zeroStd.ok());
    }

    void shuffleSeeds()
    {
        auto order = [](uint64_t seed, bool reshuffle, int64_t epoch, int64_t buffer = 100) {
            auto p = make(PipelineSpec(rows(50)).shuffle(buffer, seed, reshuffle));
            return labels(drain(*p, epoch));
        };
        const auto a = order(5, true, 0);
        std::vector<int32_t> sorted = a;
        std::sort(sorted.begin(), sorted.end());
        std::vector<int32_t> all(50);
        std::iota(all.begin(), all.end(), 0);
        QCOMPARE(sorted, all);  // a permutation
        QVERIFY(a != all);
        QCOMPARE(order(5, true, 0), a);    // same seed, same epoch: same order
        QVERIFY(order(5, true, 1) != a);   // reshuffled the next epoch
        QCOMPARE(order(5, false, 0), order(5, false, 3));
        QVERIFY(order(6, true, 0) != a);
        // A small buffer only shuffles locally.
        const auto local = order(1, true, 0, 4);
        for (std::size_t i = 0; i < local.size(); ++i) QVERIFY(local[i] <= int32_t(i) + 3);
        // Unset seeds derive from the pipeline's seed.
        PipelineSpec s1(rows(50)), s2(rows(50));
        s1.shuffle(100);
        s2.shuffle(100);
        s1.seed = 1;
        s2.seed = 2;
        QVERIFY(labels(drain(*make(s1), 0)) != labels(drain(*make(s2), 0)));
    }

    void parallelMapDeterministic()
    {
        // Uneven per-element time (from the key) makes completion order differ from input order.
        auto jitter = customMapFn("jitter", [](Element&& e, const MapContext&) -> Result<Element> {
            std::this_thread::sleep_for(std::chrono::microseconds(200 * ((e.key * 7919) % 5)));
            return std::move(e);
        });
        auto run = [&](int64_t parallel, std::optional<bool> det) {
            PipelineSpec s(rows(40));
            s.seed = 3;
            s.map(jitter, parallel, det).map(castFn(DType::U8)).map(reshapeFn({3, 1, 1}))
                .map(randomFlipFn(FlipMode::Vertical), parallel, det).map(castFn(DType::F32)).batch(5).prefetch(2);
            return drain(*make(s), 1);
        };
        const auto seq = run(1, std::nullopt);
        const auto par = run(4, std::nullopt);
        const auto autoPar = run(kAutotune, std::nullopt);
        QCOMPARE(seq.size(), std::size_t(8));
        QCOMPARE(labels(par), labels(seq));
        QCOMPARE(labels(autoPar), labels(seq));
        for (std::size_t i = 0; i < seq.size(); ++i) {
            QCOMPARE(values(par[i].x), values(seq[i].x));
            QCOMPARE(values(autoPar[i].x), values(seq[i].x));
        }
        // Opting out: the same elements, in whatever order they finish.
        auto loose = labels(run(4, false));
        auto want = labels(seq);
        std::sort(loose.begin(), loose.end());
        std::sort(want.begin(), want.end());
        QCOMPARE(loose, want);
    }

    void repeatTakeSkipShard()
    {
        auto p = make(PipelineSpec(rows(5)).repeat(3));
        auto es = drain(*p, 0);
        QCOMPARE(labels(es), (std::vector<int32_t>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4}));
        QVERIFY(es[0].key != es[5].key);  // augmentation differs per repetition
        QCOMPARE(p->examplesPerEpoch(), int64_t(15));
        QCOMPARE(labels(drain(*make(PipelineSpec(rows(10)).skip(3).take(4)), 0)), (std::vector<int32_t>{3, 4, 5, 6}));
        auto endless = make(PipelineSpec(rows(3)).repeat().take(7).batch(2));
        QCOMPARE(endless->batchesPerEpoch(), int64_t(4));
        QCOMPARE(labels(drain(*endless, 0)), (std::vector<int32_t>{0, 1, 2, 0, 1, 2, 0}));
        QCOMPARE(make(PipelineSpec(rows(3)).repeat())->batchesPerEpoch(), int64_t(-1));
        QCOMPARE(labels(drain(*make(PipelineSpec(rows(0 + 3)).take(0).repeat()), 0)).size(), std::size_t(0));
    }

    void shardCoverage()
    {
        for (int64_t n : {10, 17}) {
            for (bool shuffled : {false, true}) {
                std::set<int32_t> seen;
                int64_t total = 0;
                for (int64_t index = 0; index < 3; ++index) {
                    PipelineSpec s(rows(n));
                    if (shuffled) s.shuffle(n, 11);  // every worker shuffles alike, then takes its shard
                    s.shard(3, index);
                    auto p = make(s);
                    const auto got = labels(drain(*p, 2));
                    QCOMPARE(p->examplesPerEpoch(), int64_t(got.size()));
                    for (int32_t v : got) QVERIFY2(seen.insert(v).second, "shards overlap");
                    total += int64_t(got.size());
                }
                QCOMPARE(total, n);
                QCOMPARE(int64_t(seen.size()), n);
            }
        }
    }

    // Auto-sharding by element: worker w keeps positions [B*w/n, B*(w+1)/n) of each block of the
    // global batch B after the last take, so without a shuffle the workers' k-th batches together
    // are one process's k-th batch, the last partial one included; with a shuffle after the
    // shard they still cover every element once.
    void autoShardByElement()
    {
        const int64_t global = 5;
        PipelineSpec whole(rows(23));
        whole.take(21).batch(global).prefetch(2);
        auto batchLabels = [](Pipeline& p, int64_t epoch, bool sharded) {
            std::vector<std::vector<int32_t>> out;
            if (!p.startEpoch(epoch).ok()) return out;
            for (;;) {
                auto b = p.next();
                if (!b.ok() || !b->has_value()) break;
                if ((**b).localShard != sharded || (sharded && (**b).globalRows != 5)) return std::vector<std::vector<int32_t>>{};
                const Tensor& y = (**b).y;
                out.emplace_back(y.data<int32_t>(), y.data<int32_t>() + y.numel());
            }
            return out;
        };
        auto one = make(whole);
        QVERIFY(one);
        const auto expected = batchLabels(*one, 0, false);
        QCOMPARE(expected.size(), std::size_t(5));  // 4 x 5 + 1
        for (int n : {2, 3}) {
            std::vector<std::vector<std::vector<int32_t>>> perWorker;
            std::set<int32_t> shuffledSeen;
            for (int w = 0; w < n; ++w) {
                auto sharded = autoShardPipeline(whole, n, w, "run.json: pipeline");
                VERIFY_OK(sharded);
                QCOMPARE(sharded->policy, AutoShardPolicy::Data);
                QCOMPARE(sharded->spec.ops[1].kind, TransformKind::Shard);  // right after take(21)
                QCOMPARE(sharded->localBatch, global * (w + 1) / n - global * w / n);
                QCOMPARE(sharded->spec.batchSize(), sharded->localBatch);
                VERIFY_MSG(sharded->description, "by element");
                VERIFY_MSG(sharded->description, "after take(21)");
                PipelineOptions o;
                o.globalBatch = sharded->globalBatch;
                auto p = make(sharded->spec, o);
                QVERIFY(p);
                QCOMPARE(p->shardedGlobalBatch(), global);
                perWorker.push_back(batchLabels(*p, 0, true));
                QVERIFY(!perWorker.back().empty());
                QCOMPARE(p->batchesPerEpoch(), int64_t(perWorker.back().size()));
                // A shuffle after the shard point: this worker's elements in another order.
                PipelineSpec shuffled = sharded->spec;
                shuffled.ops.insert(shuffled.ops.begin() + 2, TransformSpec::shuffle(50, 7));
                for (int32_t v : labels(drain(*make(shuffled, o), 1))) QVERIFY2(shuffledSeen.insert(v).second, "shards overlap");
            }
            QCOMPARE(shuffledSeen.size(), std::size_t(21));
            // The remainder (position 0 of the last block) is worker 0's: it alone has a 5th batch.
            QCOMPARE(perWorker[0].size(), std::size_t(5));
            QCOMPARE(perWorker[std::size_t(n - 1)].size(), std::size_t(4));
            for (std::size_t k = 0; k < expected.size(); ++k) {
                std::vector<int32_t> joined;
                for (const auto& batches : perWorker)
                    if (k < batches.size()) joined.insert(joined.end(), batches[k].begin(), batches[k].end());
                QCOMPARE(joined, expected[k]);
            }
        }
    }

    void autoShardPolicies()
    {
        const std::string cacheFile = tmp("shard-cache.bin");
        PipelineSpec csv(SourceSpec::csv({"/d/a.csv", "/d/b.csv", "/d/c.csv"}, "label"));
        csv.cache(cacheFile).batch(64).prefetch();
        // auto: by file when there are enough files and nothing before the batch counts elements.
        auto w0 = autoShardPipeline(csv, 2, 0), w1 = autoShardPipeline(csv, 2, 1);
        VERIFY_OK(w0);
        VERIFY_OK(w1);
        QCOMPARE(w1->policy, AutoShardPolicy::File);
        QCOMPARE(w0->spec.source.paths, (std::vector<std::string>{"/d/a.csv", "/d/c.csv"}));
        QCOMPARE(w1->spec.source.paths, (std::vector<std::string>{"/d/b.csv"}));
        QCOMPARE(w1->spec.ops.size(), csv.ops.size());
        QCOMPARE(w1->spec.ops[0].cacheFile, cacheFile + ".shard-file-1-of-2");  // tasks sharing a disk keep their own
        QCOMPARE(w1->localBatch, int64_t(32));
        VERIFY_MSG(w1->description, "reads 1 of the 3 files (b.csv)");
        VERIFY_MSG(w1->description, "batch 32 of the global 64");
        // A take before the batch counts the whole dataset: auto shards by element after it.
        PipelineSpec counted = csv;
        counted.ops.insert(counted.ops.begin(), TransformSpec::take(1000));
        auto c = autoShardPipeline(counted, 2, 1);
        VERIFY_OK(c);
        QCOMPARE(c->policy, AutoShardPolicy::Data);
        QCOMPARE(c->spec.source.paths.size(), std::size_t(3));
        QCOMPARE(c->spec.ops[1].kind, TransformKind::Shard);
        QCOMPARE(c->spec.ops[1].shardBlock, int64_t(64));
        QCOMPARE(c->spec.ops[2].cacheFile, cacheFile + ".shard-data-b64-1-of-2");
        // Evaluation deals single elements, so that a small validation set reaches every worker.
        auto rr = autoShardPipeline(counted, 2, 1, "validation pipeline", true);
        VERIFY_OK(rr);
        QCOMPARE(rr->spec.ops[1].shardBlock, int64_t(2));
        QCOMPARE(rr->spec.ops[2].cacheFile, cacheFile + ".shard-data-b2-1-of-2");
        VERIFY_MSG(rr->description, "takes element 1 of every 2 after take(1000)");
        // An unordered parallel map before the shard point would make the shards overlap.
        PipelineSpec unordered(rows(10));
        unordered.map(customMapFn("noop", [](Element&& e, const MapContext&) -> Result<Element> { return std::move(e); }), 2, false)
            .take(8)
            .batch(4);
        auto overlap = autoShardPipeline(unordered, 2, 0);
        QVERIFY(!overlap.ok());
        VERIFY_MSG(overlap.error().toString(), "runs in parallel with deterministic false");
        unordered.ops[0].deterministic = true;
        VERIFY_OK(autoShardPipeline(unordered, 2, 0));
        // More workers than files: auto falls back to elements, "file" is refused.
        QCOMPARE(autoShardPipeline(csv, 4, 3)->policy, AutoShardPolicy::Data);
        PipelineSpec fileOnly = csv;
        fileOnly.autoShard = AutoShardPolicy::File;
        auto tooFew = autoShardPipeline(fileOnly, 4, 0, "run.json: pipeline");
        QVERIFY(!tooFew.ok());
        VERIFY_MSG(tooFew.error().toString(), "run.json: pipeline: auto_shard \"file\" needs at least one file per worker");
        VERIFY_MSG(tooFew.error().toString(), "lists 3 files for 4 workers");
        PipelineSpec idx(SourceSpec::idxDir("/d"));
        idx.batch(8);
        idx.autoShard = AutoShardPolicy::File;
        auto oneFile = autoShardPipeline(idx, 2, 0);
        QVERIFY(!oneFile.ok());
        VERIFY_MSG(oneFile.error().toString(), "the idx source reads one file");
        VERIFY_MSG(oneFile.error().hint, "auto_shard \"data\"");
        // Interleave stays first; the shard follows it.
        PipelineSpec inter(SourceSpec::csv({"/d/a.csv", "/d/b.csv"}, "label"));
        inter.interleave().batch(4);
        inter.autoShard = AutoShardPolicy::Data;
        QCOMPARE(autoShardPipeline(inter, 2, 0)->spec.ops[1].kind, TransformKind::Shard);
        // Too small a global batch; and off leaves the pipeline alone.
        PipelineSpec tiny(rows(10));
        tiny.batch(1);
        auto small = autoShardPipeline(tiny, 2, 0);
        QVERIFY(!small.ok());
        VERIFY_MSG(small.error().toString(), "a global batch of 1 cannot be shared by 2 workers");
        tiny.autoShard = AutoShardPolicy::Off;
        auto off = autoShardPipeline(tiny, 2, 1);
        VERIFY_OK(off);
        QCOMPARE(off->policy, AutoShardPolicy::Off);
        QCOMPARE(off->spec.toJson().dump(), tiny.toJson().dump());
        // JSON: the policy and a dealt block round-trip; bad values are named.
        PipelineSpec dataPolicy = tiny;
        dataPolicy.autoShard = AutoShardPolicy::Data;
        dataPolicy.ops.insert(dataPolicy.ops.begin(), TransformSpec::shard(2, 1, 6));
        const nlohmann::json j = dataPolicy.toJson();
        QCOMPARE(j["auto_shard"].get<std::string>(), std::string("data"));
        QCOMPARE(j["transformations"][0]["block"].get<int64_t>(), int64_t(6));
        auto back = PipelineSpec::fromJson(nlohmann::json::parse(R"({"source": {"kind": "idx", "dir": "d"}, "auto_shard": "file",
            "transformations": [{"op": "shard", "num_shards": 2, "index": 1, "block": 6}]})"));
        VERIFY_OK(back);
        QCOMPARE(back->autoShard, AutoShardPolicy::File);
        QCOMPARE(back->ops[0].shardBlock, int64_t(6));
        QCOMPARE(back->ops[0].label(), std::string("shard(2, 1, block 6)"));
        auto badPolicy = PipelineSpec::fromJson(nlohmann::json::parse(R"({"source": {"kind": "idx", "dir": "d"}, "auto_shard": "files"})"), "run.json: pipeline");
        QVERIFY(!badPolicy.ok());
        VERIFY_MSG(badPolicy.error().toString(), "run.json: pipeline.auto_shard");
        VERIFY_MSG(badPolicy.error().toString(), "expected \"auto\", \"file\", \"data\" or \"off\"");
        auto badBlock = PipelineSpec::fromJson(nlohmann::json::parse(R"({"source": {"kind": "idx", "dir": "d"},
            "transformations": [{"op": "shard", "num_shards": 3, "index": 1, "block": 2}]})"));
        QVERIFY(!badBlock.ok());
        VERIFY_MSG(badBlock.error().toString(), "block: 2 is smaller than num_shards 3");
    }

    // A shard, skip or take right after a CSV source passes over the lines it drops without
    // parsing them (the per-worker cost of by-element auto-sharding is the lines it keeps). So a
    // bad line in another worker's share is that worker's error alone; with skip_bad_records
    // every line is parsed, because a dropped bad line is no element and the workers must count
    // the same positions.
    void csvShardPassesOverLines()
    {
        // Rows 0..9 (label = row), a blank line after row 4, row 3 not a number.
        std::string text = "f,label\n";
        for (int r = 0; r < 10; ++r) text += (r == 3 ? std::string("x") : std::to_string(r * 10)) + "," + std::to_string(r) + "\n" + (r == 4 ? "\n" : "");
        writeBytes(tmp("shard.csv"), text);
        const SourceSpec src = SourceSpec::csv({tmp("shard.csv")}, "label");

        std::string err;
        auto even = make(PipelineSpec(src).shard(2, 0));
        QCOMPARE(labels(drain(*even, 0, &err)), (std::vector<int32_t>{0, 2, 4, 6, 8}));
        QVERIFY2(err.empty(), err.c_str());
        QCOMPARE(even->snapshot().stages[0].produced, int64_t(5));  // the source parsed only these
        PipelineSpec blocks(src);
        blocks.ops.push_back(TransformSpec::shard(2, 0, 4));  // positions 0, 1 of every 4
        QCOMPARE(labels(drain(*make(blocks), 0, &err)), (std::vector<int32_t>{0, 1, 4, 5, 8, 9}));
        QVERIFY2(err.empty(), err.c_str());
        drain(*make(PipelineSpec(src).shard(2, 1)), 0, &err);
        VERIFY_MSG(err, "line 5, column 1 ('f'): 'x' is not a number");
        QCOMPARE(labels(drain(*make(PipelineSpec(src).skip(4).take(3)), 0, &err)), (std::vector<int32_t>{4, 5, 6}));
        QVERIFY2(err.empty(), err.c_str());

        // skip_bad_records: positions count the 9 good rows, so the shards still partition them.
        std::set<int32_t> seen;
        for (int64_t w = 0; w < 2; ++w) {
            PipelineSpec s(src);
            s.skipBadRecords = true;
            s.shard(2, w);
            auto p = make(s);
            for (int32_t v : labels(drain(*p, 0, &err))) QVERIFY2(seen.insert(v).second, "shards overlap");
            QVERIFY2(err.empty(), err.c_str());
            QCOMPARE(p->badRecords(), int64_t(1));
        }
        QCOMPARE(seen, (std::set<int32_t>{0, 1, 2, 4, 5, 6, 7, 8, 9}));
    }

    void cacheMemoryAndFile()
    {
        auto calls = std::make_shared<std::atomic<int>>(0);
        auto counted = customMapFn("counted", [calls](Element&& e, const MapContext&) -> Result<Element> {
            ++*calls;
            return std::move(e);
        });
        auto p = make(PipelineSpec(rows(6)).map(counted).cache().shuffle(6, 1));
        const auto e0 = labels(drain(*p, 0));
        QCOMPARE(calls->load(), 6);
        const auto e1 = labels(drain(*p, 1));
        QCOMPARE(calls->load(), 6);  // served from memory
        QCOMPARE(e1.size(), std::size_t(6));

        const std::string file = tmp("cache.bin");
        auto f1 = make(PipelineSpec(rows(6)).map(counted).cache(file));
        const auto first = drain(*f1, 0);
        QVERIFY(fs::exists(file));
        QCOMPARE(calls->load(), 12);
        auto f2 = make(PipelineSpec(rows(6)).map(counted).cache(file));  // a new run reuses the file
        const auto second = drain(*f2, 0);
        QCOMPARE(calls->load(), 12);
        QCOMPARE(labels(second), labels(first));
        QCOMPARE(values(second[4].x), values(first[4].x));
        QCOMPARE(second[4].key, first[4].key);

        // An abandoned pass leaves no file; a damaged file is reported with its byte offset.
        auto partial = make(PipelineSpec(rows(6)).cache(tmp("partial.bin")));
        VERIFY_OK(partial->startEpoch(0));
        VERIFY_OK(partial->nextElement());
        VERIFY_OK(partial->startEpoch(1));
        QVERIFY(!fs::exists(tmp("partial.bin")));
        const std::string bytes = readBytes(file);
        writeBytes(tmp("damaged.bin"), bytes.substr(0, bytes.size() - 30));
        std::string err;
        drain(*make(PipelineSpec(rows(6)).map(counted).cache(tmp("damaged.bin"))), 0, &err);
        VERIFY_MSG(err, "cache file '" + tmp("damaged.bin") + "' is corrupt at byte");
        // A cache made by another pipeline (fewer rows taken, no map) is refused, not replayed.
        err.clear();
        drain(*make(PipelineSpec(rows(6)).map(counted).take(3).cache(file)), 0, &err);
        VERIFY_MSG(err, "cache file '" + file + "' was made by another pipeline");
        VERIFY_MSG(err, "delete it");
        err.clear();
        drain(*make(PipelineSpec(rows(6)).cache(file)), 0, &err);
        VERIFY_MSG(err, "was made by another pipeline");
        // The same pipeline with other parallelism replays it.
        QCOMPARE(labels(drain(*make(PipelineSpec(rows(6)).map(counted, 2).cache(file)), 0)), labels(first));
        // Someone else's file is named as such and left alone; a folder is named as a folder.
        writeBytes(tmp("data.csv"), "v,label\n1,0\n");
        err.clear();
        drain(*make(PipelineSpec(rows(6)).cache(tmp("data.csv"))), 0, &err);
        VERIFY_MSG(err, "'" + tmp("data.csv") + "' exists and is not a TrainStudio cache file");
        QVERIFY(err.find("delete") == std::string::npos);
        QCOMPARE(readBytes(tmp("data.csv")), std::string("v,label\n1,0\n"));
        fs::create_directories(tmp("cache_dir"));
        err.clear();
        drain(*make(PipelineSpec(rows(6)).cache(tmp("cache_dir"))), 0, &err);
        VERIFY_MSG(err, "'" + tmp("cache_dir") + "' is a folder");
    }

    void interleaveFiles()
    {
        const std::vector<int> sizes{4, 2, 3};
        std::vector<std::string> paths;
        for (std::size_t f = 0; f < sizes.size(); ++f) {
            std::string text = "v,label\n";
            for (int r = 0; r < sizes[f]; ++r) text += std::to_string(100 * f + std::size_t(r)) + ",0\n";
            paths.push_back(tmp("part" + std::to_string(f) + ".csv"));
            writeBytes(paths.back(), text);
        }
        auto order = [&](int64_t cycle, int64_t block, int64_t parallel) {
            PipelineSpec s(SourceSpec::csv(paths, "label"));
            s.interleave(cycle, block, parallel);
            auto p = make(s);
            std::vector<int> v;
            for (const auto& e : drain(*p, 0)) v.push_back(int(e.x.data<float>()[0]));
            return v;
        };
        const std::vector<int> want{0, 100, 1, 101, 2, 200, 3, 201, 202};
        QCOMPARE(order(2, 1, 1), want);
        QCOMPARE(order(2, 1, kAutotune), want);  // parallel reads keep the order
        QCOMPARE(order(2, 2, 2), (std::vector<int>{0, 1, 100, 101, 2, 3, 200, 201, 202}));
        QCOMPARE(order(1, 1, 1), (std::vector<int>{0, 1, 2, 3, 100, 101, 200, 201, 202}));
        auto noInterleave = make(PipelineSpec(SourceSpec::csv(paths, "label")));
        QCOMPARE(noInterleave->batchesPerEpoch(), int64_t(-1));  // counted when first read
        QCOMPARE(drain(*noInterleave, 0).size(), std::size_t(9));
        QCOMPARE(noInterleave->examplesPerEpoch(), int64_t(9));

        // A shard after a sequential interleave passes over the other shard's lines unparsed:
        // 200 is not a number, and only the shard holding its position reads it.
        writeBytes(paths[2], "v,label\nx,0\n201,0\n202,0\n");
        auto sharded = [&](int64_t index, int64_t parallel, std::string* err) {
            PipelineSpec s(SourceSpec::csv(paths, "label"));
            s.interleave(2, 1, parallel).shard(2, index);
            std::vector<int> v;
            for (const auto& e : drain(*make(s), 0, err)) v.push_back(int(e.x.data<float>()[0]));
            return v;
        };
        std::string err;
        QCOMPARE(sharded(0, 1, &err), (std::vector<int>{0, 1, 2, 3, 202}));
        QVERIFY2(err.empty(), err.c_str());
        sharded(1, 1, &err);
        VERIFY_MSG(err, "'x' is not a number");

        // Files of one source with other feature columns are refused naming both (a column
        // 'extra' was read as a second feature, and failed later as a batch naming no file).
        writeBytes(tmp("other.csv"), "v,extra,label\n1,2,0\n");
        writeBytes(tmp("renamed.csv"), "w,label\n1,0\n");
        for (const std::string& odd : {tmp("other.csv"), tmp("renamed.csv")}) {
            std::string why;
            drain(*make(PipelineSpec(SourceSpec::csv({paths[0], odd}, "label"))), 0, &why);
            VERIFY_MSG(why, "CSV files '" + paths[0] + "' and '" + odd + "' have different feature columns: (v) and (");
        }
        // Naming the columns to read: the files agree.
        SourceSpec picked = SourceSpec::csv({paths[0], tmp("other.csv")}, "label");
        picked.featureColumns = {"v"};
        QCOMPARE(drain(*make(PipelineSpec(picked)), 0).size(), std::size_t(5));
    }

    void batchShapeMismatch()
    {
        Tensor a = Tensor::zeros(Shape{2, 2});
        auto uneven = customMapFn("uneven", [](Element&& e, const MapContext&) -> Result<Element> {
            if (e.key == 1) e.x = Tensor::zeros(Shape{3});
            return std::move(e);
        });
        std::string err;
        drain(*make(PipelineSpec(SourceSpec::fromTensorSlices(a)).map(uneven).batch(2)), 0, &err);
        VERIFY_MSG(err, "batch(2): cannot batch element 1 (features f32 (3,)) with element 0 (f32 (2,))");

        // Training batches must be f32 with labels: the error says what to add.
        Tensor u8 = Tensor::empty(Shape{2, 4}, DType::U8);
        Tensor y = Tensor::zeros(Shape{2}, DType::I32);
        auto p = make(PipelineSpec(SourceSpec::fromTensorSlices(u8, y)).batch(2));
        VERIFY_OK(p->startEpoch(0));
        auto b = p->next();
        QVERIFY(!b.ok());
        VERIFY_MSG(b.error().hint, "normalise");
    }

    // ---- threads ------------------------------------------------------------------------------

    void cancelUnderLoad()
    {
        const int baseline = threadCount();
        auto burn = customMapFn("burn", [](Element&& e, const MapContext&) -> Result<Element> {
            volatile double acc = 0;
            for (int i = 0; i < 20000; ++i) acc = acc + std::sqrt(double(i));
            return std::move(e);
        });
        auto build = [&] {
            PipelineSpec s(rows(100000));
            s.map(burn, 4).map(sleepFn(2), 3).shuffle(64, 1).batch(8).prefetch(4);
            return make(s);
        };
        {
            auto p = build();
            VERIFY_OK(p->startEpoch(0));
            for (int i = 0; i < 3; ++i) VERIFY_OK(p->next());
            QVERIFY(threadCount() >= baseline + 8);
            Clock::time_point cancelledAt;
            std::thread canceller([&] {
                std::this_thread::sleep_for(std::chrono::milliseconds(30));
                cancelledAt = Clock::now();
                p->cancel();
            });
            Result<std::optional<Batch>> r = std::optional<Batch>();
            for (int i = 0; i < 100000; ++i) {
                r = p->next();
                if (!r.ok()) break;
            }
            const double latency = secondsSince(cancelledAt);
            canceller.join();
            QVERIFY(!r.ok());
            QCOMPARE(r.error().code, ErrorCode::Cancelled);
            QVERIFY2(latency < 0.5, qPrintable(QString::number(latency)));
            QCOMPARE(p->startEpoch(1).error().code, ErrorCode::Cancelled);  // sticky
            const auto t0 = Clock::now();
            p.reset();
            QVERIFY(secondsSince(t0) < 0.5);
        }
        QVERIFY2(threadsBackTo(baseline), qPrintable(QString::number(threadCount()) + " vs " + QString::number(baseline)));

        // Stopping mid-epoch without cancel: a new epoch, then destruction, join every thread promptly.
        {
            auto p = build();
            for (int epoch = 0; epoch < 4; ++epoch) {
                VERIFY_OK(p->startEpoch(epoch));
                VERIFY_OK(p->next());
            }
            const auto t0 = Clock::now();
            p.reset();
            QVERIFY2(secondsSince(t0) < 0.5, qPrintable(QString::number(secondsSince(t0))));
        }
        QVERIFY(threadsBackTo(baseline));

        // cancel() while the consumer is blocked on an empty buffer (nothing is ready for a while).
        {
            PipelineSpec s(rows(10));
            s.map(sleepFn(300)).batch(2).prefetch(1);
            auto p = make(s);
            VERIFY_OK(p->startEpoch(0));
            std::thread canceller([&] {
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
                p->cancel();
            });
            const auto t0 = Clock::now();
            auto r = p->next();
            canceller.join();
            QVERIFY(!r.ok());
            QCOMPARE(r.error().code, ErrorCode::Cancelled);
            QVERIFY(secondsSince(t0) < 0.45);
        }
        QVERIFY(threadsBackTo(baseline));
    }

    void rewritesKeepResults()
    {
        // The static rewrites (map fusion, pure maps after shuffle, normalise onto batches) must
        // not change a single value or the order: compare with the same pipeline where each
        // rewrite is blocked (different parallelism per map; a custom map between the pure map
        // and shuffle/batch).
        Tensor x = Tensor::empty(Shape{64, 4, 4, 1}, DType::U8);
        Tensor y = Tensor::empty(Shape{64}, DType::I32);
        for (int64_t i = 0; i < x.numel(); ++i) x.data<uint8_t>()[i] = uint8_t((i * 37) % 251);
        for (int64_t i = 0; i < 64; ++i) y.data<int32_t>()[i] = int32_t(i);
        auto identity = customMapFn("identity", [](Element&& e, const MapContext&) -> Result<Element> { return std::move(e); });
        PipelineSpec fused(SourceSpec::fromTensorSlices(x, y));
        fused.map(randomFlipFn(), 2).map(randomCropFn(4, 4, 1), 2).map(castFn(DType::F32), 1).shuffle(16, 5).map(normaliseFn(), 1).batch(8);
        PipelineSpec plain(SourceSpec::fromTensorSlices(x, y));
        plain.map(randomFlipFn(), 2).map(randomCropFn(4, 4, 1), 3).map(castFn(DType::F32), 1).map(identity, 2).shuffle(16, 5)
            .map(normaliseFn(), 1).map(identity, 2).batch(8);
        auto a = make(fused);
        auto b = make(plain);
        QVERIFY(a && b);
        const auto names = a->stageNames();
        QVERIFY2(std::find(names.begin(), names.end(), "map(random_flip + random_crop, 2)") != names.end(),
                 qPrintable(QString::fromStdString(names[1])));
        for (int epoch = 0; epoch < 2; ++epoch) {
            const auto ea = drain(*a, epoch);
            const auto eb = drain(*b, epoch);
            QCOMPARE(ea.size(), std::size_t(8));
            QCOMPARE(eb.size(), ea.size());
            for (std::size_t i = 0; i < ea.size(); ++i) {
                QCOMPARE(values(ea[i].x), values(eb[i].x));
                QCOMPARE(labels({ea[i]}), labels({eb[i]}));
            }
        }
    }

    void nextEpochWarmsUp()
    {
        // At the end of an epoch the next epoch's chain starts filling (prefetch, parallel map)
        // before startEpoch() is called, and serves exactly what a cold start would.
        PipelineSpec s(rows(64));
        s.shuffle(32, 3).map(sleepFn(1), 2).batch(4).prefetch(4);
        auto p = make(s);
        QVERIFY(p);
        const auto first = drain(*p, 0);
        QCOMPARE(first.size(), std::size_t(16));
        // batch(), the stage the prefetch thread pulls from, counts what it makes as it makes it.
        auto batches = [&] { const auto st = p->snapshot().stages; return st[st.size() - 2].produced; };
        const int64_t before = batches();
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // validation, say
        QVERIFY2(batches() > before, "nothing was prefetched for epoch 1");
        const auto warm = drain(*p, 1);
        auto q = make(s);
        const auto cold = drain(*q, 1);
        QCOMPARE(labels(warm), labels(cold));
        QVERIFY(labels(warm) != labels(first));  // reshuffled
        // Starting another epoch than the warmed one discards it.
        const auto other = drain(*p, 5);
        auto r = make(s);
        QCOMPARE(labels(other), labels(drain(*r, 5)));
    }

    void trainerCancelWakesBlockedInput()
    {
        // The trainer waits on a pipeline that needs 300 ms per element; Trainer::cancel() from
        // another thread must end fit() at once (cancelled, not failed), not after the batch.
        auto model = parseModelText(R"({"format": "trainstudio-model", "version": 1, "name": "tiny", "layers": [
            {"id": "input", "type": "Input", "attrs": {"shape": [3]}},
            {"id": "head", "type": "Dense", "inputs": ["input"], "attrs": {"units": 400, "activation": "softmax"}}],
            "compile": {"loss": "sparse_categorical_crossentropy", "optimizer": {"type": "sgd", "learning_rate": 0.01}}})",
                                    "tiny.json");
        VERIFY_OK(model);
        TrainConfig tc;
        tc.epochs = 1;
        auto trainer = Trainer::create(*model, tc);
        VERIFY_OK(trainer);
        VERIFY_OK((*trainer)->initialise());
        PipelineSpec s(rows(100));
        s.map(sleepFn(300)).batch(2).prefetch(1);
        auto p = make(s);
        QVERIFY(p);
        std::thread canceller([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(900));  // a step or so in
            (*trainer)->cancel();
        });
        const auto t0 = Clock::now();
        auto fit = (*trainer)->fit(*p, nullptr, nullptr);
        const double took = secondsSince(t0);
        canceller.join();
        VERIFY_OK(fit);
        QVERIFY(fit->cancelled);
        QVERIFY2(took < 1.3, qPrintable(QString::number(took)));  // 0.9 s + prompt wake-up, not + 0.6 s per batch
    }

    // ---- accounting ---------------------------------------------------------------------------

    void stallVerdicts()
    {
        // A training-like loop (20 ms of compute per step) behind a map that sleeps 4 ms per element,
        // four elements per batch: 16 ms of input per step (44% of the step when nothing overlaps).
        telemetry::EventBus bus;
        auto sub = bus.subscribe({"test", 4096, telemetry::kindMask<telemetry::PipelineSampleEvent, telemetry::FindingEvent>()});
        PipelineOptions options;
        options.bus = &bus;
        options.runId = "run-1";

        PipelineSpec slow(rows(400));
        slow.map(sleepFn(4)).batch(4);
        slow.windowSteps = 10;
        auto p = make(slow, options);
        const PipelineWindow w = consume(*p, 25, 20);
        QCOMPARE(w.steps, int64_t(25));
        QVERIFY2(w.waitShare >= 0.20, w.verdict.c_str());
        QCOMPARE(w.bound, InputBound::Highly);
        QCOMPARE(w.bottleneck, std::string("map(slow)"));
        VERIFY_MSG(w.verdict, "steps 1-25: highly input-bound");
        VERIFY_MSG(w.verdict, "most likely map(slow)");
        VERIFY_MSG(w.recommendation, "num_parallel_calls");
        QVERIFY(w.stages[1].produced >= 100);
        QVERIFY(w.stages[1].criticalShare > 0.8);
        QVERIFY(p->lastStep().waitSeconds > 0.015);
        QVERIFY(p->lastWindow().has_value());
        QCOMPARE(p->lastWindow()->steps, int64_t(10));

        const auto events = sub->drain();
        int samples = 0, findings = 0;
        for (const auto& e : events) {
            if (const auto* s = std::get_if<telemetry::PipelineSampleEvent>(&e)) {
                ++samples;
                QCOMPARE(s->stamp.runId, std::string("run-1"));
                QCOMPARE(s->stamp.lane.thread, std::string("input"));
            } else if (const auto* f = std::get_if<telemetry::FindingEvent>(&e)) {
                ++findings;
                QCOMPARE(f->kind, std::string("input-bound"));
                QCOMPARE(f->severity, std::string("high"));
                VERIFY_MSG(f->message, "map(slow)");
            }
        }
        QCOMPARE(samples, 2 * 3);  // two windows of 10 steps, three stages
        QCOMPARE(findings, 2);

        // The same with AUTOTUNE: parallel map and prefetch keep the consumer fed.
        PipelineSpec tuned(rows(400));
        tuned.map(sleepFn(4), kAutotune).batch(4).prefetch(kAutotune);
        tuned.autotune.cpuBudget = 2;  // this machine's cores
        auto t = make(tuned);
        const PipelineWindow tw = consume(*t, 40, 20);
        QVERIFY2(tw.waitShare < 0.05, tw.verdict.c_str());
        QCOMPARE(tw.bound, InputBound::No);
        VERIFY_MSG(tw.verdict, "not input-bound");
        bool sawParallelism = false;
        for (const auto& k : t->knobs())
            if (k.knob == "parallelism") {
                sawParallelism = true;
                QVERIFY(k.autotuned);
                QCOMPARE(k.value, int64_t(2));
            }
        QVERIFY(sawParallelism);
    }

    void autotuneArithmetic()
    {
        auto stage = [](const char* name, const char* kind, bool async) {
            StageStats s;
            s.name = name;
            s.kind = kind;
            s.async = async;
            return s;
        };
        PipelineSnapshot from, to;
        from.stages = {stage("src", "source", false), stage("map(f)", "map", true), stage("prefetch", "prefetch", true)};
        to = from;
        to.timeSeconds = 1.0;
        to.steps = 10;
        to.stepSeconds = 1.0;
        to.waitSeconds = 0.5;                                   // consumer works 50 ms per step
        to.stages[1].produced = 40;
        to.stages[1].busySeconds = 0.72;                        // 18 ms per element, 4 per step
        to.stages[1].blockedSeconds = 0.5;
        to.stages[2].produced = 10;
        to.stages[2].bytesProduced = 10 * 1000;
        to.stages[2].blockedSeconds = 0.5;
        const std::vector<TuningKnob> knobs{{1, TuningKnob::Kind::Parallelism, 1, 1, 8}, {2, TuningKnob::Kind::BufferSize, 2, 1, 64}};
        Autotuner tuner(8, int64_t(1) << 30);
        const auto v = tuner.tune(from, to, knobs);
        QCOMPARE(v[0], int64_t(2));  // ceil(1.25 * 0.018 * 4 / 0.05)
        QCOMPARE(v[1], int64_t(4));  // doubled: the consumer waited on it
        Autotuner oneCore(1, int64_t(1) << 30);
        QCOMPARE(oneCore.tune(from, to, knobs)[0], int64_t(1));  // CPU budget
        Autotuner tinyRam(8, 1 << 20);
        const std::vector<TuningKnob> bigBuffer{{2, TuningKnob::Kind::BufferSize, 2000, 1, 4096}};
        to.stages[2].bytesProduced = 10 * 1000 * 1000;  // 1 MB per element
        QVERIFY(tinyRam.tune(from, to, bigBuffer)[0] < 2000);

        // Calm intervals give threads back one at a time.
        PipelineSnapshot calm = to;
        calm.waitSeconds = 0;
        calm.stages[1].busySeconds = 0.04;
        calm.stages[1].blockedSeconds = 0;
        calm.stages[2].blockedSeconds = 0;
        const std::vector<TuningKnob> four{{1, TuningKnob::Kind::Parallelism, 4, 1, 8}};
        Autotuner t(8, int64_t(1) << 30);
        QCOMPARE(t.tune(from, calm, four)[0], int64_t(4));
        QCOMPARE(t.tune(from, calm, four)[0], int64_t(4));
        QCOMPARE(t.tune(from, calm, four)[0], int64_t(3));
    }

    void windowAttribution()
    {
        // Consumer waited 1 s at the prefetch; behind it batch (0.1 s self) and a parallel map
        // (2 threads, 1.6 s of work) that its producer waited on for 0.9 s.
        PipelineSnapshot a, b;
        auto st = [](const char* n, const char* k, bool async, double busy, double blocked, int par) {
            StageStats s;
            s.name = n;
            s.kind = k;
            s.async = async;
            s.busySeconds = busy;
            s.blockedSeconds = blocked;
            s.parallelism = par;
            return s;
        };
        a.stages = {st("src", "source", false, 0, 0, 1), st("map(f)", "map", true, 0, 0, 2), st("batch(4)", "batch", false, 0, 0, 1),
                    st("prefetch", "prefetch", true, 0, 0, 1)};
        b.stages = {st("src", "source", false, 0.1, 0, 1), st("map(f)", "map", true, 1.6, 0.9, 2),
                    st("batch(4)", "batch", false, 0.1, 0, 1), st("prefetch", "prefetch", true, 0, 1.0, 1)};
        b.timeSeconds = 2;
        b.steps = 10;
        b.stepSeconds = 2;
        b.waitSeconds = 1;
        const PipelineWindow w = analyseWindow(a, b);
        QCOMPARE(w.bound, InputBound::Highly);
        QCOMPARE(w.bottleneck, std::string("map(f)"));
        double sum = 0;
        for (const auto& s : w.stages) sum += s.criticalSeconds;
        QVERIFY(std::abs(sum - 1.0) < 1e-9);
        // prefetch: 0.1 (batch) vs 0.9 (blocked on map) -> map's 0.9 splits 0.8 (map) : 0.1 (src).
        QVERIFY(std::abs(w.stages[2].criticalSeconds - 0.1) < 1e-9);
        QVERIFY(std::abs(w.stages[1].criticalSeconds - 0.8) < 1e-9);
        QVERIFY(std::abs(w.stages[0].criticalSeconds - 0.1) < 1e-9);
        QCOMPARE(pipelineSampleEvents(w, {}).size(), std::size_t(4));
        QVERIFY(inputBoundFinding(w, {}).has_value());
        b.waitSeconds = 0.08;
        QCOMPARE(analyseWindow(a, b).bound, InputBound::No);
        b.waitSeconds = 0.1;
        QCOMPARE(analyseWindow(a, b).bound, InputBound::Moderately);
    }

    // ---- run configuration --------------------------------------------------------------------

    void runConfigPipeline()
    {
        // 64 fake 28x28 images per split, labels 0..9.
        const std::string dir = tmp("fmnist");
        fs::create_directories(dir);
        std::vector<uint8_t> px(64 * 784), lab(64);
        for (std::size_t i = 0; i < px.size(); ++i) px[i] = uint8_t((i * 31) % 251);
        for (std::size_t i = 0; i < lab.size(); ++i) lab[i] = uint8_t(i % 10);
        for (const char* split : {"train", "t10k"}) {
            writeBytes(dir + "/" + split + "-images-idx3-ubyte.gz", idxBytes({64, 28, 28}, px), true);
            writeBytes(dir + "/" + split + "-labels-idx1-ubyte.gz", idxBytes({64}, lab), true);
        }
        nlohmann::json j = {
            {"model_file", std::string(TS_SOURCE_DIR) + "/resources/models/seed_mlp.json"},
            {"epochs", 2},
            {"batch_size", 32},
            {"pipeline",
             {{"source", {{"kind", "idx"}, {"dir", dir}}},
              {"transformations",
               {{{"op", "map"}, {"fn", "normalise"}, {"num_parallel_calls", "AUTOTUNE"}},
                {{"op", "shuffle"}, {"buffer_size", 64}, {"seed", 1}},
                {{"op", "prefetch"}, {"buffer_size", "AUTOTUNE"}}}}}}};
        auto cfg = RunConfig::fromJson(j, "run.json");
        VERIFY_OK(cfg);
        QVERIFY(cfg->pipeline.has_value());
        QCOMPARE(cfg->toJson()["pipeline"]["transformations"].size(), std::size_t(3));
        auto prepared = prepareRun(*cfg);
        VERIFY_OK(prepared);
        PreparedRun run = std::move(prepared).value();
        QVERIFY(run.pipeline);
        QVERIFY(!run.train);
        QCOMPARE(run.trainSource(), static_cast<BatchSource*>(run.pipeline.get()));
        QVERIFY(run.validationSource());  // the idx folder's test split
        // batch(32) was inserted before the trailing prefetch.
        const auto& ops = run.config.pipeline->ops;
        QCOMPARE(ops.size(), std::size_t(4));
        QCOMPARE(ops[2].kind, TransformKind::Batch);
        QCOMPARE(ops[2].batchSize, int64_t(32));
        auto fit = run.trainer->fit(*run.trainSource(), run.validationSource(), nullptr);
        VERIFY_OK(fit);
        QCOMPARE(fit->steps, int64_t(4));
        QVERIFY(!std::isnan(fit->last.valLoss));

        // The run's own settings apply to its pipeline (flags override a configuration): a batch
        // size replaces the batch op's, a limit takes the first N elements, shuffle off drops the
        // shuffles. They were ignored: every variant trained the same 16 steps.
        {
            nlohmann::json own = j;
            own["pipeline"]["transformations"].insert(own["pipeline"]["transformations"].begin() + 1,
                                                      nlohmann::json{{"op", "batch"}, {"size", 8}});
            auto ownCfg = RunConfig::fromJson(own, "run.json");
            VERIFY_OK(ownCfg);
            ownCfg->batchSize = 16;
            ownCfg->limit = 40;
            ownCfg->shuffle = false;
            auto ownRun = prepareRun(*ownCfg);
            VERIFY_OK(ownRun);
            const auto& o = ownRun->config.pipeline->ops;
            QCOMPARE(o.size(), std::size_t(4));  // take(40), normalise, batch(16), prefetch
            QCOMPARE(o[0].kind, TransformKind::Take);
            QCOMPARE(o[0].count, int64_t(40));
            QCOMPARE(o[2].kind, TransformKind::Batch);
            QCOMPARE(o[2].batchSize, int64_t(16));
            QCOMPARE(ownRun->config.batchSize, int64_t(16));
            auto ownFit = ownRun->trainer->fit(*ownRun->trainSource(), nullptr, nullptr);
            VERIFY_OK(ownFit);
            QCOMPARE(ownFit->steps, int64_t(2 * 3));  // 40 rows in batches of 16: 3 a epoch
            // A limit moves the ops after it, not their seeds: an unseeded shuffle keeps the seed
            // its first position gave it; the folded settings are not applied again by a rerun.
            nlohmann::json unseeded = j;
            unseeded["pipeline"]["transformations"][1] = {{"op", "shuffle"}, {"buffer_size", 64}};
            auto unseededCfg = RunConfig::fromJson(unseeded, "run.json");
            VERIFY_OK(unseededCfg);
            const uint64_t before = unseededCfg->pipeline->derivedSeed(1);
            unseededCfg->limit = 40;
            auto unseededRun = prepareRun(*unseededCfg);
            VERIFY_OK(unseededRun);
            QCOMPARE(unseededRun->config.pipeline->ops[2].kind, TransformKind::Shuffle);
            QCOMPARE(unseededRun->config.pipeline->ops[2].seed.value_or(0), before);
            QCOMPARE(unseededRun->config.limit, int64_t(0));
            // Without an explicit batch size the pipeline's own stays.
            auto keepCfg = RunConfig::fromJson(own, "run.json");
            keepCfg->batchSize = -1;
            auto keepRun = prepareRun(*keepCfg);
            VERIFY_OK(keepRun);
            QCOMPARE(keepRun->config.batchSize, int64_t(8));
        }

        // The model expects 784 values; a pipeline that crops to 20x20 is refused before training.
        nlohmann::json bad = j;
        bad["pipeline"]["source"]["layout"] = "image";
        bad["pipeline"]["transformations"][1] = {{"op", "map"}, {"fn", "random_crop"}, {"size", {20, 20}}};
        auto badCfg = RunConfig::fromJson(bad, "run.json");
        VERIFY_OK(badCfg);
        auto refused = prepareRun(*badCfg);
        QVERIFY(!refused.ok());
        QCOMPARE(refused.error().code, ErrorCode::ShapeMismatch);
        VERIFY_MSG(refused.error().message, "training pipeline");
        VERIFY_MSG(refused.error().message, "model's input is (784,)");

        // Negative class ids (an npy of int labels) are refused before training, not at step 1.
        {
            Tensor x = Tensor::empty(Shape{8, 784});
            Tensor y = Tensor::empty(Shape{8}, DType::I32);
            for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = 0.5f;
            for (int i = 0; i < 8; ++i) y.data<int32_t>()[i] = i == 3 ? -3 : i;
            VERIFY_OK(writeNpy(tmp("neg_x.npy"), x));
            VERIFY_OK(writeNpy(tmp("neg_y.npy"), y));
            nlohmann::json negative = {{"model_file", std::string(TS_SOURCE_DIR) + "/resources/models/seed_mlp.json"},
                                       {"epochs", 1},
                                       {"batch_size", 8},
                                       {"data", {{"dir", dir}}},
                                       {"pipeline", {{"source", {{"kind", "npy"}, {"x", tmp("neg_x.npy")}, {"y", tmp("neg_y.npy")}}}}}};
            auto negCfg = RunConfig::fromJson(negative, "run.json");
            VERIFY_OK(negCfg);
            auto negRun = prepareRun(*negCfg);
            QVERIFY(!negRun.ok());
            VERIFY_MSG(negRun.error().message, "training pipeline: batch(8): '" + tmp("neg_y.npy") +
                                                   "' row 3: label -3 is not one of the model's 10 class ids (0..9)");  // the labels' file
            VERIFY_MSG(negRun.error().hint, "class ids start at 0");

            // Class ids for a loss that reads one-hot rows: refused before training (it failed at
            // step 1, recorded as a failed run; earlier builds read the ids as floats).
            for (int i = 0; i < 8; ++i) y.data<int32_t>()[i] = i;
            VERIFY_OK(writeNpy(tmp("ids_y.npy"), y));
            nlohmann::json oneHot = negative;
            oneHot["loss"] = "categorical_crossentropy";
            oneHot["pipeline"]["source"]["y"] = tmp("ids_y.npy");
            auto oneHotRun = prepareRun(*RunConfig::fromJson(oneHot, "run.json"));
            QVERIFY(!oneHotRun.ok());
            VERIFY_MSG(oneHotRun.error().message,
                       "training pipeline: categorical_crossentropy needs one-hot label rows of 10, but the labels are class ids");
            VERIFY_MSG(oneHotRun.error().hint, "sparse_categorical_crossentropy");

            // Float class ids (a numpy float array of 0., 1., 2.): the hint names the cast that
            // makes them class ids, and with it the run is prepared.
            Tensor fy = Tensor::empty(Shape{8});
            for (int i = 0; i < 8; ++i) fy.data<float>()[i] = float(i);
            VERIFY_OK(writeNpy(tmp("float_y.npy"), fy));
            nlohmann::json floatIds = negative;
            floatIds["pipeline"]["source"]["y"] = tmp("float_y.npy");
            auto floatRun = prepareRun(*RunConfig::fromJson(floatIds, "run.json"));
            QVERIFY(!floatRun.ok());
            VERIFY_MSG(floatRun.error().hint, R"({"op": "map", "fn": "cast", "dtype": "i32", "target": "y"})");
            floatIds["pipeline"]["transformations"] = nlohmann::json::array({nlohmann::json::parse(R"({"op": "map", "fn": "cast", "dtype": "i32", "target": "y"})")});
            VERIFY_OK(prepareRun(*RunConfig::fromJson(floatIds, "run.json")));
            // Cast so, an id beyond the outputs is still named by its row (the cast is not moved
            // after the batch, where the ids would be checked as floats, i.e. not at all).
            fy.data<float>()[5] = 12.f;
            VERIFY_OK(writeNpy(tmp("float_y.npy"), fy));
            auto beyondCast = prepareRun(*RunConfig::fromJson(floatIds, "run.json"));
            QVERIFY(!beyondCast.ok());
            VERIFY_MSG(beyondCast.error().message, "'" + tmp("float_y.npy") + "' row 5: label 12 is not one of the model's 10 class ids");

            // A class id beyond the output, in a later batch of a CSV: named by file and line, as
            // the batch is stacked, before the loss sees it as "batch row N".
            std::string csv = "label,a,b\n";
            for (int i = 0; i < 40; ++i) csv += std::to_string(i == 29 ? 12 : i % 10) + ",0.5,0.25\n";
            writeBytes(tmp("labels.csv"), csv);
            nlohmann::json beyond = nlohmann::json::parse(R"({
              "model": {"format": "trainstudio-model", "version": 1, "name": "small",
                        "layers": [{"id": "in", "type": "Input", "attrs": {"shape": [2]}},
                                   {"id": "out", "type": "Dense", "inputs": ["in"], "attrs": {"units": 10, "activation": "softmax"}}],
                        "outputs": ["out"], "compile": {"loss": "sparse_categorical_crossentropy", "optimizer": "sgd"}},
              "epochs": 1, "batch_size": 8,
              "pipeline": {"source": {"kind": "csv", "label_column": "label"}}})");
            beyond["data"] = {{"dir", dir}};
            beyond["pipeline"]["source"]["paths"] = {tmp("labels.csv")};
            auto beyondCfg = RunConfig::fromJson(beyond, "run.json");
            VERIFY_OK(beyondCfg);
            auto beyondRun = prepareRun(*beyondCfg);
            VERIFY_OK(beyondRun);  // the first batch (lines 2..9) is fine
            auto fitted = beyondRun->trainer->fit(*beyondRun->trainSource(), nullptr, nullptr);
            QVERIFY(!fitted.ok());
            VERIFY_MSG(fitted.error().message, "'" + tmp("labels.csv") + "' line 31: label 12 is not one of the model's 10 class ids");
            VERIFY_MSG(fitted.error().hint, "at least 13");

            // A pipeline without a seed of its own takes the run's (--seed, the configuration's
            // "seed"), as tf.data's ops take the global seed; its own "seed" wins over it. The
            // recorded pipeline holds the seed it drew with.
            {
                nlohmann::json shuffled = beyond;
                shuffled["pipeline"]["source"]["paths"] = {tmp("labels_ok.csv")};
                std::string ok = "label,a,b\n";
                for (int i = 0; i < 40; ++i) ok += std::to_string(i % 10) + "," + std::to_string(i) + ",0\n";
                writeBytes(tmp("labels_ok.csv"), ok);
                shuffled["pipeline"]["transformations"] = nlohmann::json::parse(R"([{"op": "shuffle", "buffer_size": 40}, {"op": "batch", "batch_size": 40}])");
                shuffled["batch_size"] = 40;
                auto firstOrder = [&](const nlohmann::json& j, uint64_t runSeed) {
                    auto c = RunConfig::fromJson(j, "run.json");
                    if (!c.ok()) qFatal("%s", c.error().toString().c_str());
                    c->seed = runSeed;
                    auto r = prepareRun(*c);
                    if (!r.ok()) qFatal("%s", r.error().toString().c_str());
                    BatchSource& src = *r->trainSource();
                    if (!src.startEpoch(0).ok()) qFatal("startEpoch");
                    auto b = src.next();
                    if (!b.ok() || !b->has_value()) qFatal("no batch");
                    std::vector<float> order;
                    if ((*b)->x.shape() != Shape({40, 2})) qFatal("batch %s", (*b)->x.shape().toString().c_str());
                    for (int64_t i = 0; i < 40; ++i) order.push_back((*b)->x.data<float>()[i * 2]);
                    return std::make_pair(order, r->config.pipeline->toJson().value("seed", nlohmann::json()));
                };
                const auto [seed1, recorded1] = firstOrder(shuffled, 1);
                const auto [seed2, recorded2] = firstOrder(shuffled, 2);
                QVERIFY(seed1 != seed2);
                QCOMPARE(firstOrder(shuffled, 1).first, seed1);
                QCOMPARE(recorded1, nlohmann::json(1));
                QCOMPARE(recorded2, nlohmann::json(2));
                shuffled["pipeline"]["seed"] = 5;
                QCOMPARE(firstOrder(shuffled, 1).first, firstOrder(shuffled, 2).first);
                // Seeds fill 64 bits (a recorded derived seed): read back, above 2^63 too.
                shuffled["pipeline"]["transformations"][0]["seed"] = uint64_t{18446744073709551557ull};
                shuffled["pipeline"]["seed"] = uint64_t{9223372036854775808ull};
                auto wide = RunConfig::fromJson(shuffled, "run.json");
                VERIFY_OK(wide);
                QCOMPARE(*wide->pipeline->ops[0].seed, uint64_t{18446744073709551557ull});
                QCOMPARE(wide->pipeline->seed, uint64_t{9223372036854775808ull});
                // A negative op seed is refused like a negative pipeline seed.
                shuffled["pipeline"]["transformations"][0]["seed"] = -5;
                auto negativeSeed = RunConfig::fromJson(shuffled, "run.json");
                QVERIFY(!negativeSeed.ok());
                VERIFY_MSG(negativeSeed.error().message, "pipeline.transformations[0].seed");
            }

            {
                nlohmann::json v = beyond;
                v["pipeline"]["source"]["paths"] = {tmp("labels_ok.csv")};
                v["validation_pipeline"] = v["pipeline"];
                // The two pipelines may not cache into one file (each found the other's data).
                v["pipeline"]["transformations"] = nlohmann::json::parse(R"([{"op": "cache", "filename": "shared.cache"}])");
                v["validation_pipeline"]["transformations"] = v["pipeline"]["transformations"];
                auto shared = RunConfig::fromJson(v, "run.json");
                QVERIFY(!shared.ok());
                VERIFY_MSG(shared.error().message,
                           "run.json: validation_pipeline.transformations[0] caches into 'shared.cache', which pipeline.transformations[0] caches into too");
            }

            // With skip_bad_records that element is a bad record like any other: dropped as the
            // batch takes it (39 elements: 5 batches, the last of 7), not the whole run failed.
            beyond["pipeline"]["skip_bad_records"] = true;
            auto skipRun = prepareRun(*RunConfig::fromJson(beyond, "run.json"));
            VERIFY_OK(skipRun);
            auto skipped = skipRun->trainer->fit(*skipRun->trainSource(), nullptr, nullptr);
            VERIFY_OK(skipped);
            QCOMPARE(skipped->steps, int64_t(5));
        }

        nlohmann::json typo = j;
        typo["pipeline"]["transformations"][1]["buffer"] = 3;
        auto typoCfg = RunConfig::fromJson(typo, "run.json");
        QVERIFY(!typoCfg.ok());
        VERIFY_MSG(typoCfg.error().message, "run.json: pipeline.transformations[1]");
    }
};

QTEST_APPLESS_MAIN(TestPipeline)
#include "tst_pipeline.moc"
