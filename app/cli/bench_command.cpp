// trainstudio-cli bench: our training throughput next to the PyTorch reference
// (../shared/bench/torch_train.py) run in the same invocation, alternating A B A B so that both
// see the same machine noise, reporting medians and the median of the per-pair ratios.

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "commands.h"
#include "train/run_config.h"

namespace tscli {

ts::Result<ts::ModelSpec> loadModel(const std::string& nameOrPath);

namespace {

class EpochRates final : public ts::TrainListener {
public:
    std::vector<double> rates;
    double lastValAccuracy = 0;
    void onEpoch(const ts::EpochEvent& e) override { rates.push_back(e.samplesPerSec); }
};

struct Sample {
    double samplesPerSec = 0;
    double accuracy = 0;
};

ts::Result<Sample> runOurs(const std::string& model, const BenchOptions& o, const std::string& precision)
{
    ts::RunConfig cfg;
    cfg.precision = ts::PrecisionConfig{};
    TS_ASSIGN(cfg.precision->policy, ts::PrecisionConfig::parsePolicy(precision, "--precision"));
    TS_ASSIGN(cfg.model, loadModel(model));
    cfg.epochs = o.epochs;
    cfg.validate = false;
    cfg.limit = o.limit;
    cfg.strategy.kind = o.strategy;
    cfg.strategy.threads = o.threads;
    if (o.strategy == "mirrored")
        for (int i = 0; i < o.threads; ++i) cfg.strategy.devices.push_back(ts::Device{ts::DeviceKind::Cpu, i});
    TS_ASSIGN(ts::PreparedRun run, ts::prepareRun(cfg));
    EpochRates listener;
    TS_TRY(run.trainer->fit(*run.train, nullptr, &listener));
    std::vector<double> steady(listener.rates.begin() + (listener.rates.size() > 1 ? 1 : 0), listener.rates.end());
    Sample s;
    s.samplesPerSec = median(steady);
    // Test accuracy after the run, for a sanity check next to PyTorch's.
    ts::InMemoryBatchOptions vo;
    vo.batchSize = 1000;
    vo.shuffle = false;
    vo.featureShape = run.train->options().featureShape;
    TS_ASSIGN(auto test, ts::InMemoryBatchSource::create(run.data->test, vo));
    TS_ASSIGN(ts::EvalResult ev, run.trainer->evaluate(*test));
    s.accuracy = ev.accuracy;
    return s;
}

ts::Result<Sample> runTorch(const std::string& model, const BenchOptions& o, const std::string& dir)
{
    // PyTorch at its best on this machine (see shared/bench/README.md): OpenMP OpenBLAS
    // (libopenblas0-openmp) with the right kernel instead of Debian's default pthread build.
    std::ostringstream cmd;
    // env -u: PyTorch runs with libgomp's defaults, not the spin count this process was given.
    cmd << "cd '" << dir << "' && env -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY -u TS_NO_REEXEC LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp OPENBLAS_CORETYPE=" << openblasCoreType() << " "
        << "OMP_NUM_THREADS=" << o.threads << " " << o.python << " torch_train.py --model " << model << " --epochs "
        << o.epochs << " --threads " << o.threads << " 2>&1";
    std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.str().c_str(), "r"), pclose);
    if (!pipe) return ts::makeError(ts::ErrorCode::IoError, "cannot start " + o.python);
    std::string last, all;
    std::array<char, 4096> buf{};
    while (fgets(buf.data(), static_cast<int>(buf.size()), pipe.get())) {
        all += buf.data();
        std::string line = buf.data();
        if (!line.empty() && line.front() == '{') last = line;
    }
    auto j = nlohmann::json::parse(last, nullptr, false);
    if (j.is_discarded() || !j.contains("samples_per_sec"))
        return ts::makeError(ts::ErrorCode::IoError, "torch_train.py gave no result:\n" + all.substr(0, 2000),
                             "check that python3-torch and python3-numpy are installed (packaging/install-deps.sh)");
    return Sample{j["samples_per_sec"].get<double>(), j.value("test_accuracy", 0.0)};
}

// "A busy neighbour": another process spinning on one core while a measurement runs.
class BusyNeighbour {
public:
    BusyNeighbour()
    {
        m_pid = ::fork();
        if (m_pid == 0) {
            volatile unsigned long x = 0;
            for (;;) x = x + 1;  // async-signal-safe: nothing but arithmetic after fork
        }
    }
    ~BusyNeighbour()
    {
        if (m_pid > 0) {
            ::kill(m_pid, SIGKILL);
            ::waitpid(m_pid, nullptr, 0);
        }
    }
    BusyNeighbour(const BusyNeighbour&) = delete;
    BusyNeighbour& operator=(const BusyNeighbour&) = delete;

private:
    pid_t m_pid = -1;
};

} // namespace

void addBenchCommand(CLI::App& app, BenchOptions& o)
{
    auto* c = app.add_subcommand("bench", "Training throughput next to PyTorch (same machine, same invocation)");
    c->add_option("--suite", o.suite, "train (vs PyTorch), pipeline (input throughput and stalls), overhead "
                                      "(telemetry + store on vs off), store (write rate, series load) or distributed (Gloo all-reduce, "
                                      "2 workers vs 1 process vs PyTorch DDP, then ParameterServer on worker daemons)");
    c->add_option("--models", o.models, "comma-separated: mlp, cnn");
    c->add_flag("--busy", o.busy, "train: also measure both engines with one core taken by a spinning process");
    c->add_option("--precision", o.precision,
                  "train: our mixed-precision policy (float32, mixed_bfloat16, mixed_float16); a mixed one is measured next to "
                  "our float32 in the same pairs, and PyTorch stays float32")
        ->check(CLI::IsMember({"float32", "mixed_float16", "mixed_bfloat16"}));
    c->add_option("--threads", o.threads, "threads for both engines");
    c->add_option("--pairs", o.pairs, "alternating (ours, PyTorch) pairs; medians are reported");
    c->add_option("--epochs", o.epochs, "epochs per run (the first is warm-up and excluded)");
    c->add_option("--strategy", o.strategy, "our strategy: one-device or mirrored (one replica per thread)");
    c->add_option("--limit", o.limit, "train on the first N examples only (ours)");
    c->add_option("--torch-dir", o.torchDir, "folder with torch_train.py (default: ../shared/bench)");
    c->add_option("--python", o.python, "Python with torch");
    c->add_flag("--no-torch", o.noTorch, "measure only TrainStudio");
    c->add_flag("--json", o.json, "print one JSON object per model");
}

int runBench(const BenchOptions& o)
{
    if (o.suite != "train") return runBenchSuite(o);
    std::string dir = o.torchDir.empty() ? std::string(TS_BENCH_DIR) : o.torchDir;
    bool torch = !o.noTorch;
    if (torch && !std::filesystem::exists(std::filesystem::path(dir) / "torch_train.py")) {
        std::cerr << "note: " << dir << "/torch_train.py not found; measuring TrainStudio only (pass --torch-dir)\n";
        torch = false;
    }
    std::stringstream ss(o.models);
    std::string model;
    int rc = 0;
    while (std::getline(ss, model, ',')) {
        // Index 0: an idle machine; 1: with a busy neighbour (--busy).
        std::vector<double> ours[2], theirs[2], ratios[2];
        std::vector<double> ours32, mixedGain;  // --precision: our float32, and policy / float32 per pair
        const bool mixed = o.precision != "float32";
        double ourAcc = 0, theirAcc = 0, ourAcc32 = 0;
        for (int p = 0; p < o.pairs; ++p) {
            for (int busy = 0; busy <= (o.busy ? 1 : 0); ++busy) {
                std::unique_ptr<BusyNeighbour> neighbour;
                if (busy) neighbour = std::make_unique<BusyNeighbour>();
                std::string line = "  pair " + std::to_string(p + 1) + (busy ? " (busy neighbour)" : "") + ": trainstudio ";
                double f32Rate = 0;
                if (mixed && !busy) {
                    auto a32 = runOurs(model, o, "float32");
                    if (!a32.ok()) {
                        std::cerr << "error: " << model << ": " << a32.error().toString() << "\n";
                        return 1;
                    }
                    f32Rate = a32->samplesPerSec;
                    ours32.push_back(f32Rate);
                    ourAcc32 = a32->accuracy;
                    line += "float32 " + std::to_string(static_cast<long>(f32Rate)) + "  " + o.precision + " ";
                }
                auto a = runOurs(model, o, o.precision);
                if (!a.ok()) {
                    std::cerr << "error: " << model << ": " << a.error().toString() << "\n";
                    return 1;
                }
                ours[busy].push_back(a->samplesPerSec);
                ourAcc = a->accuracy;
                line += std::to_string(static_cast<long>(a->samplesPerSec));
                if (f32Rate > 0) {
                    mixedGain.push_back(a->samplesPerSec / f32Rate);
                    line += " (" + std::to_string(mixedGain.back()).substr(0, 5) + "x)";
                }
                if (torch) {
                    auto b = runTorch(model, o, dir);
                    if (!b.ok()) {
                        std::cerr << "error: " << b.error().toString() << "\n";
                        return 1;
                    }
                    theirs[busy].push_back(b->samplesPerSec);
                    theirAcc = b->accuracy;
                    ratios[busy].push_back(a->samplesPerSec / b->samplesPerSec);
                    line += "  pytorch " + std::to_string(static_cast<long>(b->samplesPerSec)) + "  ratio " +
                            std::to_string(ratios[busy].back()).substr(0, 5);
                }
                if (!o.json) std::cout << line << "\n" << std::flush;
            }
        }
        if (o.json) {
            nlohmann::json j = {{"model", model}, {"threads", o.threads}, {"strategy", o.strategy}, {"pairs", o.pairs},
                                {"epochs", o.epochs}, {"trainstudio_samples_per_sec", median(ours[0])},
                                {"trainstudio_test_accuracy", ourAcc}, {"precision", o.precision}};
            if (mixed) {
                j["trainstudio_float32_samples_per_sec"] = median(ours32);
                j["trainstudio_float32_test_accuracy"] = ourAcc32;
                j["precision_speedup_median"] = median(mixedGain);
            }
            if (torch) {
                j["pytorch_samples_per_sec"] = median(theirs[0]);
                j["pytorch_test_accuracy"] = theirAcc;
                j["ratio_median"] = median(ratios[0]);
            }
            if (o.busy) {
                j["busy"] = {{"trainstudio_samples_per_sec", median(ours[1])},
                             {"trainstudio_loss", 1 - median(ours[1]) / median(ours[0])}};
                if (torch) {
                    j["busy"]["pytorch_samples_per_sec"] = median(theirs[1]);
                    j["busy"]["pytorch_loss"] = 1 - median(theirs[1]) / median(theirs[0]);
                    j["busy"]["ratio_median"] = median(ratios[1]);
                }
            }
            std::cout << j.dump() << "\n";
        } else {
            std::printf("%s (%d threads, %s, %d pairs, median of epochs 2..%d): trainstudio %.0f samples/s", model.c_str(),
                        o.threads, o.strategy.c_str(), o.pairs, o.epochs, median(ours[0]));
            if (mixed)
                std::printf(" in %s (%.2fx our float32's %.0f; test accuracy %.4f vs %.4f)", o.precision.c_str(), median(mixedGain),
                            median(ours32), ourAcc, ourAcc32);
            if (torch) std::printf(" | pytorch %.0f samples/s | ratio %.2fx", median(theirs[0]), median(ratios[0]));
            std::printf("\n");
            if (o.busy) {
                std::printf("%s with a busy neighbour: trainstudio %.0f samples/s (loses %.0f%%)", model.c_str(), median(ours[1]),
                            100 * (1 - median(ours[1]) / median(ours[0])));
                if (torch)
                    std::printf(" | pytorch %.0f samples/s (loses %.0f%%) | ratio %.2fx", median(theirs[1]),
                                100 * (1 - median(theirs[1]) / median(theirs[0])), median(ratios[1]));
                std::printf("\n");
            }
        }
    }
    return rc;
}

} // namespace tscli
