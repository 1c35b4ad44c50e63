// trainstudio-cli bench --suite pipeline|overhead|store: the input pipeline's throughput and
// stall share, the cost of telemetry + tracing + the run store on training, and the store's
// write rate and plot-load time. Numbers for the issue notes; nothing here is a pass/fail test.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <random>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "commands.h"
#include "data/auto_shard.h"
#include "data/dataset.h"
#include "data/image_folder.h"
#include "data/pipeline.h"
#include "data/transforms.h"
#include "store/recording.h"
#include "store/run_store.h"
#include "telemetry/bus.h"
#include "telemetry/trace_sink.h"
#include "train/run_config.h"

namespace tscli {

ts::Result<ts::ModelSpec> loadModel(const std::string& nameOrPath);

namespace {

using Clock = std::chrono::steady_clock;
double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A scratch folder removed on exit.
struct ScratchDir {
    std::filesystem::path path;
    ScratchDir()
    {
        path = std::filesystem::temp_directory_path() /
               ("trainstudio-bench-" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
        std::filesystem::create_directories(path);
    }
    ~ScratchDir()
    {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
};

// Batches per second of every epoch of `spec` (the first includes reading and decoding).
ts::Result<std::vector<double>> epochRates(const ts::PipelineSpec& spec, int epochs)
{
    TS_ASSIGN(std::unique_ptr<ts::Pipeline> p, ts::Pipeline::create(spec));
    std::vector<double> rates;
    for (int e = 0; e < epochs; ++e) {
        TS_TRY(p->startEpoch(e));
        const auto t0 = Clock::now();
        int64_t batches = 0;
        for (;;) {
            TS_ASSIGN(auto b, p->next());
            if (!b) break;
            ++batches;
        }
        rates.push_back(static_cast<double>(batches) / secondsSince(t0));
    }
    return rates;
}

// Median seconds per epoch of `spec` (a CSV source streams every epoch, so all of them count).
ts::Result<double> epochSeconds(const ts::PipelineSpec& spec, int epochs)
{
    TS_ASSIGN(std::unique_ptr<ts::Pipeline> p, ts::Pipeline::create(spec));
    std::vector<double> seconds;
    for (int e = 0; e < epochs; ++e) {
        TS_TRY(p->startEpoch(e));
        const auto t0 = Clock::now();
        for (;;) {
            TS_ASSIGN(auto b, p->next());
            if (!b) break;
        }
        seconds.push_back(secondsSince(t0));
    }
    return median(seconds);
}

// Writes the first `count` Fashion-MNIST training images as a CSV file: label, then 784 pixel
// columns of 0..255 (the layout of the Kaggle Fashion-MNIST CSVs).
ts::Status writeFashionCsv(const std::string& path, int64_t count)
{
    const std::string dir = ts::defaultFashionMnistDir();
    TS_ASSIGN(ts::InMemoryDataset d, ts::loadIdxDataset(dir + "/train-images-idx3-ubyte.gz", dir + "/train-labels-idx1-ubyte.gz",
                                                        /*flatten=*/true));
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) return ts::makeError(ts::ErrorCode::IoError, "cannot write '" + path + "'");
    std::string line = "label";
    for (int k = 1; k <= 784; ++k) line += ",pixel" + std::to_string(k);
    std::fprintf(f, "%s\n", line.c_str());
    const float* px = d.x.data<float>();
    for (int64_t i = 0; i < std::min<int64_t>(count, d.size()); ++i) {
        line = std::to_string(d.y.data<int32_t>()[i]);
        for (int64_t k = 0; k < 784; ++k) line += "," + std::to_string(std::lround(px[i * 784 + k] * 255.f));
        std::fprintf(f, "%s\n", line.c_str());
    }
    return std::fclose(f) == 0 ? ts::okStatus() : ts::makeError(ts::ErrorCode::IoError, "cannot write '" + path + "'");
}

// Writes `count` Fashion-MNIST training images as PNG files, one sub-folder per class.
ts::Status writeImageFolder(const std::string& root, int64_t count)
{
    const std::string dir = ts::defaultFashionMnistDir();
    TS_ASSIGN(ts::InMemoryDataset d, ts::loadIdxDataset(dir + "/train-images-idx3-ubyte.gz", dir + "/train-labels-idx1-ubyte.gz",
                                                        /*flatten=*/false));
    const int64_t n = std::min<int64_t>(count, d.size());
    const float* px = d.x.data<float>();  // scaled to [0, 1] by the loader
    const int32_t* labels = d.y.data<int32_t>();
    for (int64_t i = 0; i < n; ++i) {
        const std::string cls = root + "/class" + std::to_string(labels[i]);
        std::filesystem::create_directories(cls);
        ts::Tensor img = ts::Tensor::empty(ts::Shape{28, 28, 1}, ts::DType::U8);
        uint8_t* dst = img.data<uint8_t>();
        for (int64_t k = 0; k < 784; ++k) dst[k] = static_cast<uint8_t>(std::lround(px[i * 784 + k] * 255.f));
        TS_TRY(ts::writePng(cls + "/" + std::to_string(i) + ".png", img));
    }
    return ts::okStatus();
}

// Per-step input wait and step time of a training run, epochs 2.. only.
class StallListener final : public ts::TrainListener {
public:
    double wait = 0, total = 0;
    double startWait = 0;  // of it, in the first 5 steps of each epoch (the pipeline refilling)
    std::vector<double> waits;
    std::vector<double> rates;
    void onStep(const ts::StepEvent& e) override
    {
        if (e.epoch < 2) return;
        wait += e.inputWaitSeconds;
        total += e.stepSeconds;
        if (e.stepInEpoch <= 5) startWait += e.inputWaitSeconds;
        waits.push_back(e.inputWaitSeconds);
    }
    // "median 12 us, p99 80 us, max 3.1 ms; 40% of the wait in the first 5 steps of an epoch"
    std::string describe() const
    {
        if (waits.empty() || wait <= 0) return {};
        std::vector<double> w = waits;
        std::sort(w.begin(), w.end());
        char buf[200];
        std::snprintf(buf, sizeof buf, "wait per step: median %.0f us, p99 %.0f us, max %.2f ms; %.0f%% of it in the first 5 steps of an epoch",
                      1e6 * w[w.size() / 2], 1e6 * w[std::min(w.size() - 1, w.size() * 99 / 100)], 1e3 * w.back(),
                      100 * startWait / wait);
        return buf;
    }
    void onEpoch(const ts::EpochEvent& e) override
    {
        if (e.epoch >= 2) rates.push_back(e.samplesPerSec);
    }
};

ts::Result<ts::PipelineSpec> fashionPipeline(int threads, bool overlap)
{
    ts::PipelineSpec s(ts::SourceSpec::idxDir(ts::defaultFashionMnistDir()));
    s.map(ts::normaliseFn(), overlap ? ts::kAutotune : 1).shuffle(10000, 1).batch(256);
    if (overlap) s.prefetch(ts::kAutotune);
    s.autotune.cpuBudget = threads;
    return s;
}

int pipelineSuite(const BenchOptions& o)
{
    const int epochs = std::max(o.epochs, 3);
    nlohmann::json out = nlohmann::json::object();
    std::printf("Input pipeline (median batches/s of epochs 2..%d; epoch 1 reads and decodes):\n", epochs);
    // 1. Fashion-MNIST: gunzip + parse IDX, normalise, shuffle(10000), batch(256), prefetch.
    for (int threads : {1, 2}) {
        auto spec = fashionPipeline(threads, threads > 1);
        auto r = epochRates(*spec, epochs);
        if (!r.ok()) {
            std::cerr << "error: " << r.error().toString() << "\n";
            return 1;
        }
        const double med = median(std::vector<double>(r->begin() + 1, r->end()));
        std::printf("  fashion-mnist  %d thread(s): %8.0f batches/s (%8.0f samples/s), first epoch %6.0f batches/s\n", threads,
                    med, med * 256, (*r)[0]);
        out["fashion_mnist"][std::to_string(threads) + "_threads"] = {{"batches_per_sec", med}, {"first_epoch", (*r)[0]}};
    }
    // 2. An image folder of PNGs with augmentation (decode, normalise, random flip, random crop
    //    with 4 pixels of padding), shuffle, batch(128), prefetch.
    ScratchDir scratch;
    const int64_t images = o.limit > 0 ? o.limit : 6000;
    const auto tw = Clock::now();
    if (auto st = writeImageFolder((scratch.path / "images").string(), images); !st.ok()) {
        std::cerr << "error: " << st.error().toString() << "\n";
        return 1;
    }
    std::printf("  (wrote %lld PNG files in %.1f s)\n", static_cast<long long>(images), secondsSince(tw));
    for (int threads : {1, 2}) {
        const int64_t par = threads > 1 ? ts::kAutotune : 1;
        ts::PipelineSpec s(ts::SourceSpec::imageFolder((scratch.path / "images").string(), 28, 28, 1));
        s.shuffle(images, 1)
            .map(ts::normaliseFn(), par)
            .map(ts::randomFlipFn(), par)
            .map(ts::randomCropFn(28, 28, 4), par)
            .batch(128);
        if (threads > 1) s.prefetch(ts::kAutotune);
        s.autotune.cpuBudget = threads;
        auto r = epochRates(s, epochs);
        if (!r.ok()) {
            std::cerr << "error: " << r.error().toString() << "\n";
            return 1;
        }
        const double med = median(std::vector<double>(r->begin() + 1, r->end()));
        std::printf("  image folder   %d thread(s): %8.0f batches/s (%8.0f images/s), first epoch %6.0f batches/s\n", threads, med,
                    med * 128, (*r)[0]);
        out["image_folder"][std::to_string(threads) + "_threads"] = {{"batches_per_sec", med}, {"first_epoch", (*r)[0]}};
    }
    // 3. A CSV source auto-sharded by element for 2 workers: one worker's epoch against the whole
    //    file's. The worker passes over the other's lines unparsed; with skip_bad_records it
    //    must parse every line (a dropped bad line shifts the positions), as every worker did
    //    before the shard reached the source.
    {
        const std::string csv = (scratch.path / "fashion.csv").string();
        const int64_t rowsInCsv = o.limit > 0 ? o.limit : 10000;
        if (auto st = writeFashionCsv(csv, rowsInCsv); !st.ok()) {
            std::cerr << "error: " << st.error().toString() << "\n";
            return 1;
        }
        ts::PipelineSpec whole(ts::SourceSpec::csv({csv}, "label"));
        whole.batch(256);
        auto half = ts::autoShardPipeline(whole, 2, 0, "bench");
        if (!half.ok()) {
            std::cerr << "error: " << half.error().toString() << "\n";
            return 1;
        }
        ts::PipelineSpec parsed = half->spec;
        parsed.skipBadRecords = true;
        double secs[3] = {};
        const ts::PipelineSpec* specs[3] = {&whole, &half->spec, &parsed};
        for (int k = 0; k < 3; ++k) {
            auto r = epochSeconds(*specs[k], epochs);
            if (!r.ok()) {
                std::cerr << "error: " << r.error().toString() << "\n";
                return 1;
            }
            secs[k] = *r;
        }
        std::printf("  csv (%lld rows x 785 columns), seconds per epoch: whole file %.3f s; worker 0 of 2 auto-sharded by element "
                    "%.3f s (%.2fx of the whole), parsing every line %.3f s (%.2fx)\n",
                    static_cast<long long>(rowsInCsv), secs[0], secs[1], secs[1] / secs[0], secs[2], secs[2] / secs[0]);
        out["csv_auto_shard"] = {{"whole_seconds", secs[0]}, {"worker_seconds", secs[1]}, {"worker_parsing_all_seconds", secs[2]}};
    }
    // 4. The seed's MLP trained from the Fashion-MNIST pipeline: the share of step time spent
    //    waiting for input, without overlap (sequential map, no prefetch) and with AUTOTUNE.
    std::printf("Seed MLP fed by the pipeline (%d threads, epochs 2..%d):\n", o.threads, epochs);
    for (bool overlap : {false, true}) {
        ts::RunConfig cfg;
        auto model = loadModel("mlp");
        if (!model.ok()) return 1;
        cfg.model = std::move(model).value();
        cfg.epochs = epochs;
        cfg.validate = false;
        cfg.strategy.threads = o.threads;
        cfg.pipeline = *fashionPipeline(o.threads, overlap);
        auto prepared = ts::prepareRun(cfg);
        if (!prepared.ok()) {
            std::cerr << "error: " << prepared.error().toString() << "\n";
            return 1;
        }
        StallListener l;
        auto fit = prepared->trainer->fit(*prepared->trainSource(), nullptr, &l);
        if (!fit.ok()) {
            std::cerr << "error: " << fit.error().toString() << "\n";
            return 1;
        }
        const double share = l.total > 0 ? l.wait / l.total : 0;
        std::printf("  %-34s stall %5.2f%% of step time, %8.0f samples/s\n",
                    overlap ? "map AUTOTUNE + prefetch AUTOTUNE:" : "sequential map, no prefetch:", 100 * share, median(l.rates));
        if (const std::string d = l.describe(); !d.empty()) std::printf("    %s\n", d.c_str());
        if (std::getenv("TS_BENCH_STAGES"))
            if (auto w = prepared->pipeline->lastWindow())
                for (const auto& st : w->stages)
                    std::printf("      %-40s %8lld elems %7.1f us/elem busy %6.3f s blocked %6.3f s queue %lld/%lld par %d crit %.0f%%\n",
                                st.name.c_str(), (long long)st.produced, 1e6 * st.secondsPerElement, st.busySeconds,
                                st.blockedSeconds, (long long)st.queueDepth, (long long)st.queueCapacity, st.parallelism,
                                100 * st.criticalShare);
        out[overlap ? "mlp_autotune" : "mlp_sequential"] = {{"stall_share", share}, {"samples_per_sec", median(l.rates)}};
        if (overlap) {
            std::string knobs;
            for (const auto& k : prepared->pipeline->knobs())
                knobs += (knobs.empty() ? "" : ", ") + k.stage + " " + k.knob + " " + std::to_string(k.value);
            std::printf("    autotuned: %s\n", knobs.c_str());
        }
    }
    if (o.json) std::cout << out.dump() << "\n";
    return 0;
}

// The seed's MLP with telemetry off, and with the bus, the run store recording every event,
// tracing (spans per phase) and the device sampler on: samples/s of each of epochs 2..N.
ts::Result<std::vector<double>> overheadRun(const BenchOptions& o, bool on, const std::string& scratch, int index)
{
    ts::RunConfig cfg;
    TS_ASSIGN(cfg.model, loadModel("mlp"));
    cfg.epochs = std::max(o.epochs, 3);
    cfg.validate = false;
    cfg.strategy.threads = o.threads;
    TS_ASSIGN(ts::PreparedRun run, ts::prepareRun(cfg));
    ts::telemetry::EventBus bus;
    std::unique_ptr<TrainRecording> recording;
    std::unique_ptr<ts::telemetry::TraceFileSink> trace;
    if (on) {
        TrainOptions to;
        to.db = scratch + "/runs.db";
        to.runName = "overhead-" + std::to_string(index);
        TS_ASSIGN(recording, openTrainRecording(to));
        const std::string tracePath = scratch + "/trace-" + std::to_string(index) + ".json";
        TS_ASSIGN(trace, ts::telemetry::TraceFileSink::create(bus, tracePath));
        TS_TRY(recording->begin(run, bus));
        run.trainer->setTelemetry(&bus, recording->runId(), /*trace=*/true, /*traceLayers=*/false);
    }
    StallListener l;
    auto fit = run.trainer->fit(*run.trainSource(), nullptr, &l);
    if (recording) recording->fitDone(fit);
    if (trace) TS_TRY(trace->finish());
    if (!fit.ok()) return fit.takeError();
    return l.rates;
}

int overheadSuite(const BenchOptions& o)
{
    ScratchDir scratch;
    std::vector<double> off, on, ratios;
    double bestOff = 0, bestOn = 0;
    for (int p = 0; p < o.pairs; ++p) {
        // ABBA order: whichever runs second in a pair runs in a process that has already trained
        // once (heap, page cache, thread pools), so alternate which one that is.
        ts::Result<std::vector<double>> a = std::vector<double>{}, b = std::vector<double>{};
        if (p % 2 == 0) {
            a = overheadRun(o, false, scratch.path.string(), p);
            if (a.ok()) b = overheadRun(o, true, scratch.path.string(), p);
        } else {
            b = overheadRun(o, true, scratch.path.string(), p);
            if (b.ok()) a = overheadRun(o, false, scratch.path.string(), p);
        }
        if (!a.ok() || !b.ok()) {
            std::cerr << "error: " << (a.ok() ? b : a).error().toString() << "\n";
            return 1;
        }
        const double ma = median(*a), mb = median(*b);
        off.push_back(ma);
        on.push_back(mb);
        ratios.push_back(mb / ma);
        for (double r : *a) bestOff = std::max(bestOff, r);
        for (double r : *b) bestOn = std::max(bestOn, r);
        std::printf("  pair %d: off %.0f  on %.0f samples/s  (%+.2f%%)\n", p + 1, ma, mb, 100 * (mb / ma - 1));
        std::fflush(stdout);
    }
    const double overhead = 1 - median(ratios);
    const auto [ratioLow, ratioHigh] = medianInterval95(ratios);
    // A neighbour on the VM only ever slows an epoch down, so the fastest epoch of many runs is
    // the least disturbed one: comparing the best epochs is a second estimate, much less noisy
    // than the pair ratios when the machine is busy (like timeit's minimum).
    const double bestOverhead = bestOff > 0 ? 1 - bestOn / bestOff : 0;
    std::printf("mlp (%d threads, %d pairs): telemetry off %.0f samples/s | bus + store + tracing + sampler %.0f samples/s | "
                "overhead %.2f%% (median of pair ratios; 95%% bootstrap interval %.2f%% to %.2f%%)\n",
                o.threads, o.pairs, median(off), median(on), 100 * overhead, 100 * (1 - ratioHigh), 100 * (1 - ratioLow));
    std::printf("mlp fastest epoch of all runs: off %.0f | on %.0f samples/s | overhead %.2f%%\n", bestOff, bestOn, 100 * bestOverhead);
    if (o.json)
        std::cout << nlohmann::json{{"off_samples_per_sec", median(off)}, {"on_samples_per_sec", median(on)}, {"overhead", overhead}, {"overhead_interval95", {1 - ratioHigh, 1 - ratioLow}},
                                    {"best_off_samples_per_sec", bestOff}, {"best_on_samples_per_sec", bestOn}, {"best_epoch_overhead", bestOverhead}}
                         .dump()
                  << "\n";
    return 0;
}

// Store write rate (one step event at a time, as the trainer publishes them) and the time to
// load a long metric series into plot buckets.
int storeSuite(const BenchOptions& o)
{
    namespace st = ts::store;
    namespace tl = ts::telemetry;
    ScratchDir scratch;
    const int64_t steps = o.limit > 0 ? o.limit : 1'000'000;
    const std::string path = (scratch.path / "runs.db").string();
    auto store = st::RunStore::open(path);
    if (!store.ok()) {
        std::cerr << "error: " << store.error().toString() << "\n";
        return 1;
    }
    auto run = store->createRun({});
    if (!run.ok()) return 1;
    const std::string id = run->id;
    const auto t0 = Clock::now();
    for (int64_t s = 1; s <= steps; ++s) {
        tl::StepMetricsEvent e;
        e.stamp.runId = id;
        e.stamp.step = s;
        e.stamp.wallTimeUs = 1'700'000'000'000'000 + s * 1000;
        e.epoch = 1 + s / 1000;
        e.loss = 1.0 + std::sin(static_cast<double>(s) * 1e-3);
        e.metrics["accuracy"] = 0.5;
        e.samplesPerSec = 1000;
        e.learningRate = 1e-3;
        store->record(tl::Event(std::move(e)));
    }
    const double recordSec = secondsSince(t0);
    if (auto f = store->flush(); !f.ok()) {
        std::cerr << "error: " << f.error().toString() << "\n";
        return 1;
    }
    const double writeSec = secondsSince(t0);
    std::vector<double> loads, zooms;
    std::size_t points = 0;
    for (int i = 0; i < 5; ++i) {
        st::SeriesQuery q;
        q.buckets = 2000;
        auto t1 = Clock::now();
        auto s = store->series(id, "loss", q);
        loads.push_back(secondsSince(t1));
        if (!s.ok()) {
            std::cerr << "error: " << s.error().toString() << "\n";
            return 1;
        }
        points = s->points.size();
        q.step0 = steps / 2;
        q.step1 = steps / 2 + steps / 10;
        t1 = Clock::now();
        auto z = store->series(id, "loss", q);
        zooms.push_back(secondsSince(t1));
    }
    std::printf("store: %lld step events recorded in %.2f s (caller) and committed in %.2f s: %.0f events/s (dropped %llu)\n",
                static_cast<long long>(steps), recordSec, writeSec, static_cast<double>(steps) / writeSec,
                static_cast<unsigned long long>(store->droppedEvents()));
    std::printf("store: load the %lld-sample loss series into 2000 M4 buckets: %.1f ms median of 5 (%zu points); "
                "a 10%% zoom: %.1f ms\n",
                static_cast<long long>(steps), 1e3 * median(loads), points, 1e3 * median(zooms));
    if (o.json)
        std::cout << nlohmann::json{{"events", steps}, {"events_per_sec", static_cast<double>(steps) / writeSec},
                                    {"series_load_ms", 1e3 * median(loads)}, {"zoom_ms", 1e3 * median(zooms)}}
                         .dump()
                  << "\n";
    return 0;
}

} // namespace

int distributedSuite(const BenchOptions& o);  // bench_distributed.cpp

int runBenchSuite(const BenchOptions& o)
{
    if (o.suite == "distributed") return distributedSuite(o);
    if (o.suite == "pipeline") return pipelineSuite(o);
    if (o.suite == "overhead") return overheadSuite(o);
    if (o.suite == "store") return storeSuite(o);
    std::cerr << "error: unknown benchmark suite '" << o.suite << "'\n  hint: use train, pipeline, overhead, store or distributed\n";
    return 2;
}

} // namespace tscli
