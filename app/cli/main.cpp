// trainstudio-cli: the studio's runs, headless. Wiring only: the work is in core.
//   trainstudio-cli train [flags]      train a model (default: the seed's MLP on Fashion-MNIST)
//   trainstudio-cli validate FILE      print the layer table or the model's problems
//   trainstudio-cli bench [flags]      throughput next to PyTorch, as a ratio
//   trainstudio-cli runs list|show|compare|delete|export   the recorded run history
//   trainstudio-cli trace summary FILE  step-time breakdown, top spans, advice for a Chrome trace

#include <algorithm>
#include <system_error>
#include <new>
#include <cstdio>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "command_line.h"
#include "commands.h"

namespace {

// libgomp reads its wait policy when it is loaded, before main(). Its default spins a thread
// for ~300k iterations after each parallel region, which wrecks throughput when another process
// holds a core. Bound the spin by re-executing once with GOMP_SPINCOUNT set, unless the user
// chose a policy. Measured on 2 cores (seed MLP, median samples/s, idle / one core busy):
// 300: 199k / 138k, 1000: 219k / ~132k, 3000: 235k / 100k, 10000: 237k / 62k, passive ~180k-250k
// / ~150k. 1000 keeps nearly all of the idle speed and loses ~40% to a busy neighbour (PyTorch
// loses ~80%); a desktop app shares its cores with the GUI, so the busy case matters.
void ensureThreadingEnvironment(char** argv)
{
    if (std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT") || std::getenv("TS_NO_REEXEC")) return;
    setenv("GOMP_SPINCOUNT", "1000", 1);
    setenv("TS_NO_REEXEC", "1", 1);
    execv("/proc/self/exe", argv);
    // exec failed: carry on with the defaults.
}

std::size_t editDistance(const std::string& a, const std::string& b)
{
    std::vector<std::size_t> row(b.size() + 1);
    for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
        std::size_t diag = row[0];
        row[0] = i;
        for (std::size_t j = 1; j <= b.size(); ++j) {
            const std::size_t up = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
            diag = up;
        }
    }
    return row[b.size()];
}

// CLI11 answers a mistyped command ("trian", "runs lsit") with "A subcommand is required":
// name the word it did not know, the commands there are, and the nearest one.
bool reportUnknownCommand(CLI::App& app, int argc, char** argv)
{
    CLI::App* at = &app;
    std::string path = "trainstudio-cli";
    for (int i = 1; i < argc && argv[i][0] != '-'; ++i) {
        const auto subs = at->get_subcommands([](CLI::App*) { return true; });
        if (subs.empty()) return false;  // a positional argument (a file), not a command
        const std::string word = argv[i];
        CLI::App* next = nullptr;
        std::string names, nearest;
        std::size_t best = std::string::npos;
        for (CLI::App* s : subs) {
            if (s->get_name() == word) next = s;
            names += (names.empty() ? "" : ", ") + s->get_name();
            if (const std::size_t d = editDistance(word, s->get_name()); d < best) {
                best = d;
                nearest = s->get_name();
            }
        }
        if (!next) {
            std::fprintf(stderr, "error: '%s' is not a command of %s\nhint: %s%s (%s --help)\n", word.c_str(), path.c_str(),
                         best <= 2 ? ("did you mean '" + nearest + "'? the commands are: ").c_str() : "the commands are: ", names.c_str(),
                         path.c_str());
            return true;
        }
        at = next;
        path += " " + word;
    }
    return false;
}

} // namespace

int main(int argc, char** argv)
{
    ensureThreadingEnvironment(argv);
    CLI::App app{"TrainStudio command line: train models, inspect them, benchmark the engine"};
    app.require_subcommand(1);
    app.set_version_flag("--version", std::string("trainstudio-cli 0.1.0"));
    tscli::TrainOptions train;
    tscli::addTrainCommand(app, train);
    std::string validateFile;
    bool validateJson = false;
    auto* validate = app.add_subcommand("validate", "Check a model file: the layer table, or every problem");
    validate->add_option("file", validateFile, "model file (ours or a Keras model.to_json())")->required();
    validate->add_flag("--json", validateJson, "print the analysis as JSON");
    tscli::BenchOptions bench;
    tscli::addBenchCommand(app, bench);
    tscli::RunsOptions runs;
    tscli::addRunsCommand(app, runs);
    tscli::TraceOptions trace;
    tscli::addTraceCommand(app, trace);
    tscli::ClusterOptions cluster;
    tscli::addClusterCommand(app, cluster);

    if (reportUnknownCommand(app, argc, argv)) return 2;
    if (const auto exitCode = tsapp::parseCommandLine(app, "trainstudio-cli", argc, argv)) return *exitCode;
    // The last line of defence: the commands return typed errors, but a library exception that
    // escapes (a thread the system refuses to create, memory running out) is reported as an
    // error with its cause, not an abort.
    try {
        if (app.got_subcommand("train")) return tscli::runTrain(train);
        if (app.got_subcommand("validate")) return tscli::runValidate(validateFile, validateJson);
        if (app.got_subcommand("bench")) return tscli::runBench(bench);
        if (app.got_subcommand("runs")) return tscli::runRuns(runs);
        if (app.got_subcommand("trace")) return tscli::runTrace(trace);
        if (app.got_subcommand("cluster")) return tscli::runCluster(cluster);
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "error: out of memory\nhint: use a smaller model, batch or dataset, or fewer threads\n");
        return 1;
    } catch (const std::system_error& e) {
        std::fprintf(stderr, "error: the system refused a resource: %s\nhint: use fewer threads (--threads, num_parallel_calls)\n", e.what());
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\nhint: this is a bug in TrainStudio; please report it with the command that caused it\n", e.what());
        return 1;
    }
    return 2;
}
