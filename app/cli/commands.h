#pragma once

#include <string>
#include <vector>

namespace CLI { class App; }

namespace tscli {

struct TrainOptions {
    std::string model;
    std::string data;
    std::string config;
    int epochs = -1;
    long long maxSteps = 0;
    long long batchSize = -1;
    std::string optimizer;
    double learningRate = -1;
    std::string strategy = "one-device";
    std::string devices;
    int threads = 0;
    unsigned long long seed = 0;
    bool noShuffle = false;
    bool noValidation = false;
    long long limit = 0;
    long long validationLimit = 0;
    std::string loadWeights;
    std::string saveWeights;
    std::string backend;
    bool json = false;
    bool quiet = false;
};

struct BenchOptions {
    std::string models = "mlp,cnn";
    int threads = 2;
    int pairs = 3;
    int epochs = 2;
    std::string torchDir;
    std::string python = "/usr/bin/python3";
    bool noTorch = false;
    std::string strategy = "one-device";
    long long limit = 0;
    bool json = false;
};

void addTrainCommand(CLI::App& app, TrainOptions& o);
void addBenchCommand(CLI::App& app, BenchOptions& o);
int runTrain(const TrainOptions& o);
int runValidate(const std::string& file, bool json);
int runBench(const BenchOptions& o);

// Shared by train and bench: resolves a file under resources/models by short name.
std::string resolveModelPath(const std::string& nameOrPath);

} // namespace tscli
