// trainstudio-cli cluster [FILE] [--strategy S] [--task T | --out-dir DIR | --probe] [--json]:
// checks a TF_CONFIG cluster and exports the TF_CONFIG each task needs (TensorFlow's per-task
// variable): shell lines for every task, one task's JSON, or one file per task for --tf-config;
// or asks every task's trainstudio-worker whether it is ready (the coordinator's pre-flight).

#include <cstdio>
#include <algorithm>
#include <filesystem>
#include <iostream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "distribute/cluster_spec.h"
#include "remote/auth.h"
#include "remote/coordinator.h"

namespace tscli {
namespace {

// 'text' quoted for a POSIX shell (TF_CONFIG JSON has no single quotes, but a host name could).
std::string shellQuoted(const std::string& text)
{
    std::string out = "'";
    for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
}

} // namespace

void addClusterCommand(CLI::App& app, ClusterOptions& o)
{
    auto* c = app.add_subcommand("cluster", "Check a TF_CONFIG cluster and export each task's TF_CONFIG");
    c->add_option("file", o.file, "TF_CONFIG file (default: $TF_CONFIG)");
    c->add_option("--strategy", o.strategy, "also check the roles this strategy needs")
        ->check(CLI::IsMember({"multi-worker-mirrored", "parameter-server"}));
    c->add_option("--task", o.task, "print only this task's TF_CONFIG (e.g. worker:1), for TF_CONFIG=$(...)");
    c->add_option("--out-dir", o.outDir, "write one file per task (tf_config-<type>-<index>.json) for train --tf-config");
    c->add_flag("--probe", o.probe, "ask every task's trainstudio-worker whether it is ready (reachable, same version, idle)");
    c->add_option("--token-file", o.tokenFile, "with --probe: the cluster's shared token (default: $" + std::string(ts::remote::kTokenEnv) + ")");
    c->add_option("--tls-ca", o.tlsCa, "with --probe: PEM CA that signed the workers' certificates");
    c->add_flag("--json", o.json, "print the tasks and their TF_CONFIG (or, with --probe, their state) as JSON");
}

namespace {

// --probe: the pre-flight a coordinator runs, for every task it would start (the ps, worker and
// evaluator tasks of a cluster with ps tasks, else the chief, workers and evaluator). Exit 0 when
// all are ready (a run itself goes on without an evaluator that is not).
int probeCluster(const ts::ClusterSpec& spec, const ClusterOptions& o)
{
    auto token = ts::remote::loadToken(o.tokenFile);
    if (!token.ok()) {
        printError(token.error());
        return 2;
    }
    const std::string strategy = o.strategy.empty() ? (spec.count("ps") > 0 ? "parameter-server" : "multi-worker-mirrored") : o.strategy;
    ts::remote::CoordinatorOptions copts;
    copts.spec = spec;
    copts.token = *token;
    copts.tls.rootCa = o.tlsCa;
    copts.name = "trainstudio-cli cluster --probe";
    auto c = ts::remote::Coordinator::create(std::move(copts), strategy);
    if (!c.ok()) {
        printError(c.error());
        return 2;
    }
    int notReady = 0;
    nlohmann::json tasks = nlohmann::json::array();
    for (const auto& p : (*c)->probe(std::chrono::seconds(3))) {
        notReady += p.ok ? 0 : 1;
        if (o.json) {
            nlohmann::json t = {{"task", p.id.toString()}, {"address", p.address}, {"ready", p.ok}};
            if (p.ok) {
                t["worker"] = p.identity.worker;
                t["hostname"] = p.identity.hostname;
                t["pid"] = p.identity.pid;
                t["devices"] = p.identity.devices.size();
                t["version"] = p.identity.version;
            } else {
                t["problem"] = p.problem;
                t["hint"] = p.hint;
            }
            tasks.push_back(std::move(t));
        } else if (p.ok) {
            std::printf("ready    %s: %s (%s, pid %d, %zu device(s), TrainStudio %s)\n", p.label.c_str(), p.identity.worker.c_str(),
                        p.identity.hostname.c_str(), p.identity.pid, p.identity.devices.size(), p.identity.version.c_str());
        } else {
            std::printf("problem  %s\n         hint: %s\n", p.problem.c_str(), p.hint.c_str());
        }
    }
    if (o.json) std::cout << nlohmann::json{{"tasks", tasks}, {"ready", notReady == 0}}.dump() << "\n";
    else if (notReady > 0) std::printf("%d task(s) not ready\n", notReady);
    return notReady == 0 ? 0 : 1;
}

} // namespace

int runCluster(const ClusterOptions& o)
{
    auto spec = o.file.empty() ? ts::ClusterSpec::fromEnvironment() : ts::ClusterSpec::fromFile(o.file);
    if (!spec.ok()) {
        ts::Error e = spec.takeError();
        if (o.file.empty() && e.code == ts::ErrorCode::NotFound) e.hint = "name the cluster file: trainstudio-cli cluster FILE";
        printError(e);
        return 2;
    }
    if (!o.strategy.empty())
        if (ts::Status st = spec->validateFor(o.strategy); !st.ok()) {
            printError(st.error());
            return 2;
        }
    if (static_cast<int>(!o.task.empty()) + static_cast<int>(!o.outDir.empty()) + static_cast<int>(o.probe) > 1) {
        printError(ts::makeError(ts::ErrorCode::InvalidArgument, "--task, --out-dir and --probe exclude each other",
                                 "--task prints one task's TF_CONFIG; --out-dir writes every task's; --probe asks the workers"));
        return 2;
    }
    if (o.probe) return probeCluster(*spec, o);
    if (!o.task.empty()) {
        auto task = ts::parseTaskId(o.task);
        if (!task.ok()) {
            printError(ts::makeError(ts::ErrorCode::InvalidArgument, "--task " + o.task + ": expected type:index", "e.g. --task worker:1"));
            return 2;
        }
        auto tf = spec->tfConfigFor(*task);
        if (!tf.ok()) {
            ts::Error e = tf.takeError();
            e.message = "--task " + o.task + ": " + e.message;
            printError(e);
            return 2;
        }
        std::printf("%s\n", tf->c_str());
        return 0;
    }
    if (!o.outDir.empty()) {
        // The cluster file itself must not be overwritten by one of the exports.
        std::error_code ec;
        for (const auto& t : spec->tasks())
            if (!o.file.empty() &&
                std::filesystem::equivalent(o.file, std::filesystem::path(o.outDir) / ts::ClusterSpec::tfConfigFileName(t), ec)) {
                printError(ts::makeError(ts::ErrorCode::InvalidArgument,
                                         "--out-dir " + o.outDir + " would overwrite the cluster file " + o.file + " with " + t.toString() + "'s TF_CONFIG",
                                         "choose another folder"));
                return 2;
            }
        auto written = spec->writeTfConfigs(o.outDir);
        if (!written.ok()) {
            printError(written.error());
            return 1;
        }
        // TF_CONFIG files of an earlier cluster left in the folder would start tasks that are no
        // longer in it: named, not removed (they are the user's files).
        std::vector<std::string> stale;
        for (const auto& entry : std::filesystem::directory_iterator(o.outDir, ec)) {
            const std::string name = entry.path().filename().string();
            if (!name.starts_with("tf_config-") || !name.ends_with(".json")) continue;
            const bool ours = std::any_of(written->begin(), written->end(), [&](const std::string& w) {
                return std::filesystem::path(w).filename() == entry.path().filename();
            });
            if (!ours) stale.push_back(entry.path().string());
        }
        std::sort(stale.begin(), stale.end());
        if (o.json) {
            std::cout << nlohmann::json{{"files", *written}, {"stale_files", stale}}.dump() << "\n";
        } else {
            for (const auto& path : *written) std::printf("%s\n", path.c_str());
            std::printf("Wrote %zu TF_CONFIG file(s); on each machine: trainstudio-cli train --tf-config FILE ...\n", written->size());
        }
        for (const auto& path : stale)
            std::fprintf(stderr, "warning: %s is not a task of this cluster (from an earlier one?); delete it\n", path.c_str());
        return 0;
    }
    nlohmann::json tasks = nlohmann::json::array();
    for (const auto& t : spec->tasks()) {
        const std::string address = *spec->address(t);
        const std::string tf = *spec->tfConfigFor(t);
        if (o.json) {
            tasks.push_back({{"task", t.toString()}, {"address", address}, {"tf_config", nlohmann::json::parse(tf)}});
        } else {
            std::printf("# %s at %s\n", t.toString().c_str(), address.c_str());
            std::printf("export TF_CONFIG=%s\n", shellQuoted(tf).c_str());
        }
    }
    if (o.json) std::cout << nlohmann::json{{"tasks", tasks}}.dump() << "\n";
    return 0;
}

} // namespace tscli
