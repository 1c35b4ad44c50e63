// trainstudio-cuda-bench: trains the seed's MLP or the small CNN on Fashion-MNIST through the
// backend registry (the CUDA plugin loaded by path, like the apps do) and prints one JSON line in
// the format of ../shared/bench/torch_train.py, so packaging/gpu-check.sh can put the two side by
// side. It exists because trainstudio-cli does not load plugins yet (app/cli is another team's);
// once it does, `trainstudio-cli train --backend cuda` measures the same thing.
//
//   trainstudio-cuda-bench --model mlp|cnn [--epochs N] [--backend cuda|cpu] [--device gpu:0]
//                          [--fmnist DIR] [--limit N] [--batch B]

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/registry.h"
#include "data/dataset.h"
#include "model/spec.h"
#include "train/trainer.h"

namespace {

class EpochRecorder final : public ts::TrainListener {
public:
    void onEpoch(const ts::EpochEvent& e) override
    {
        rates.push_back(e.samplesPerSec);
        std::fprintf(stderr, "epoch %lld: loss %.4f accuracy %.4f %.0f samples/s\n", (long long)e.epoch, e.loss,
                     e.accuracy, e.samplesPerSec);
    }
    std::vector<double> rates;
};

int fail(const std::string& what)
{
    std::fprintf(stderr, "trainstudio-cuda-bench: %s\n", what.c_str());
    return 1;
}

} // namespace

int main(int argc, char** argv)
{
    std::string model = "mlp", backend = "cuda", device = "gpu:0", dir = ts::defaultFashionMnistDir();
    int64_t epochs = 3, limit = 0, batch = 0;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : std::string(); };
        if (a == "--model") model = next();
        else if (a == "--epochs") epochs = std::atoll(next().c_str());
        else if (a == "--backend") backend = next();
        else if (a == "--device") device = next();
        else if (a == "--fmnist") dir = next();
        else if (a == "--limit") limit = std::atoll(next().c_str());
        else if (a == "--batch") batch = std::atoll(next().c_str());
        else return fail("unknown argument " + a + " (see the comment at the top of cuda_bench.cpp)");
    }
    if (model != "mlp" && model != "cnn") return fail("--model must be mlp or cnn");
    for (const auto& msg : ts::BackendRegistry::instance().loadDefaultPlugins()) std::fprintf(stderr, "%s\n", msg.c_str());

    auto spec = ts::loadModelFile(std::string(TS_SOURCE_DIR) + "/resources/models/" +
                                  (model == "mlp" ? "seed_mlp" : "small_cnn") + ".json");
    if (!spec.ok()) return fail(spec.error().toString());
    auto data = ts::loadIdxFolder(dir, model == "mlp");
    if (!data.ok()) return fail(data.error().toString());
    auto dev = ts::Device::parse(device);
    if (!dev.ok()) return fail(dev.error().toString());

    ts::TrainConfig tc;
    tc.epochs = epochs;
    tc.seed = 0;
    tc.sampleHz = 0;
    tc.strategy.backend = backend;
    tc.strategy.devices = {*dev};
    auto trainer = ts::Trainer::create(*spec, tc);
    if (!trainer.ok()) return fail(trainer.error().toString());
    if (auto st = (*trainer)->initialise(); !st.ok()) return fail(st.error().toString());
    ts::InMemoryBatchOptions bo;
    bo.batchSize = batch > 0 ? batch : (model == "mlp" ? 256 : 128);
    bo.limit = limit;
    auto source = ts::InMemoryBatchSource::create(data->train, bo);
    if (!source.ok()) return fail(source.error().toString());
    EpochRecorder rec;
    auto fit = (*trainer)->fit(**source, nullptr, &rec);
    if (!fit.ok()) return fail(fit.error().toString());
    // Median of epochs 2..N (the first one warms up: plans, allocator, clocks), as torch_train.py.
    std::vector<double> r(rec.rates.begin() + (rec.rates.size() > 1 ? 1 : 0), rec.rates.end());
    std::sort(r.begin(), r.end());
    const double median = r.empty() ? 0.0 : r[r.size() / 2];
    std::printf("{\"engine\": \"trainstudio\", \"backend\": \"%s\", \"model\": \"%s\", \"epochs\": %lld, "
                "\"samples_per_sec\": %.1f, \"train_accuracy\": %.4f}\n",
                backend.c_str(), model.c_str(), (long long)epochs, median, fit->last.accuracy);
    return 0;
}
