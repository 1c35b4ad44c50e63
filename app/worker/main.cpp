// trainstudio-worker: a remote worker daemon. Wiring only: the service is remote/worker_service.
//   trainstudio-worker [--listen 127.0.0.1:7070] [--allow-remote] [--token-file FILE]
//                      [--name NAME] [--tls-cert PEM --tls-key PEM --tls-ca PEM] [--port-file FILE]
// Serves the Worker control service (and, for a run's coordinating task, the rendezvous; for a
// parameter-server run's ps task, the parameter service) until SIGINT/SIGTERM.

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include <CLI/CLI.hpp>

#include "command_line.h"
#include "common/allocator_tuning.h"
#include "remote/auth.h"
#include "remote/worker_service.h"
#include "train/backup.h"

namespace {

// The house format, as trainstudio-cli prints errors: the message, then what to do.
void printError(const ts::Error& e)
{
    std::cerr << "error: " << e.message << "\n";
    if (!e.hint.empty()) std::cerr << "  hint: " << e.hint << "\n";
}

} // namespace

int main(int argc, char** argv)
{
    ts::keepLargeBuffersInHeap();
    CLI::App app{"trainstudio-worker: runs training tasks (chief, worker or ps) for a TrainStudio coordinator"};
    ts::remote::WorkerOptions o;
    o.listen = "127.0.0.1:7070";
    std::string tokenFile, portFile;
    app.add_option("--listen", o.listen, "host:port to serve on (port 0: any free port)");
    app.add_flag("--allow-remote", o.allowRemote, "allow a non-loopback --listen address (reachable from other machines)");
    app.add_option("--token-file", tokenFile, "file with the cluster's shared token (default: $" + std::string(ts::remote::kTokenEnv) + ")");
    app.add_option("--name", o.name, "name reported to the coordinator (default: host:port)");
    app.add_option("--tls-cert", o.tls.certificate, "PEM certificate chain: serve TLS (with --tls-key)");
    app.add_option("--tls-key", o.tls.privateKey, "PEM private key for --tls-cert");
    app.add_option("--tls-ca", o.tls.rootCa, "PEM CA that signed the other workers' certificates (tasks verify the rendezvous with it)");
    app.add_option("--max-message-bytes", o.maxMessageBytes, "largest request accepted or reply sent (a ps task's shard travels in parts that fit)")->check(CLI::Range(64 << 10, 64 << 20));
    app.add_option("--max-weights-bytes", o.maxWeightsBytes, "largest initial-weights file a coordinator's --load-weights may send (default 2 GiB)")
        ->check(CLI::Range(int64_t{1024}, int64_t{64} << 30));
    app.add_option("--backup-root", o.backupRoot,
                   "folder under which runs' backups (--backup-dir NAME of the coordinator) are kept (default: " +
                       ts::defaultBackupRoot() + ")");
    app.add_option("--port-file", portFile, "write the port served on to FILE (useful with port 0)");
    if (const auto exitCode = tsapp::parseCommandLine(app, "trainstudio-worker", argc, argv)) return *exitCode;

    if (!portFile.empty()) {
        // Checked before serving, so a script waiting for the file hears why at once.
        namespace fs = std::filesystem;
        std::error_code ec;
        const fs::path parent = fs::path(portFile).parent_path();
        if (fs::is_directory(portFile, ec)) {
            std::cerr << "error: --port-file " << portFile << " is a folder\n  hint: name a file in it, e.g. --port-file "
                      << (fs::path(portFile) / "worker.port").string() << "\n";
            return 2;
        }
        if (!parent.empty() && !fs::is_directory(parent, ec)) {
            std::cerr << "error: --port-file " << portFile << ": the folder " << parent.string() << " does not exist\n"
                      << "  hint: create it first, or name a file in an existing folder\n";
            return 2;
        }
    }

    if (!o.backupRoot.empty()) {
        // An explicit backup root is checked before serving: otherwise the first run with
        // --backup-dir would fail on it, long after this was started.
        if (ts::Status root = ts::ensureBackupRoot(o.backupRoot); !root.ok()) {
            printError(ts::makeError(ts::ErrorCode::InvalidArgument,
                                     "--backup-root " + o.backupRoot + " is not a folder this user can write (" + root.error().message + ")",
                                     "name a folder this user can write, or leave --backup-root out (" + ts::defaultBackupRoot() + ")"));
            return 2;
        }
    }

    auto token = ts::remote::loadToken(tokenFile);
    if (!token.ok()) {
        printError(token.error());
        return 2;
    }
    o.token = *token;
    // Signals are taken by a dedicated thread (sigwait), so shutdown runs outside a handler.
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);

    auto daemon = ts::remote::WorkerDaemon::start(o);
    if (!daemon.ok()) {
        printError(daemon.error());
        return 2;
    }
    if (!portFile.empty()) {
        // A script waits for this file: failing to write it must end the daemon, not leave the
        // script waiting.
        const std::string tmp = portFile + ".tmp";
        bool written = false;
        {
            std::ofstream out(tmp);
            out << (*daemon)->port() << "\n";
            out.close();
            written = static_cast<bool>(out);
        }
        if (!written || std::rename(tmp.c_str(), portFile.c_str()) != 0) {  // readers never see a half-written file
            std::remove(tmp.c_str());
            std::cerr << "error: cannot write the port file " << portFile << "\n  hint: check that its folder exists and is writable\n";
            (*daemon)->shutdown();
            return 2;
        }
    }
    std::printf("trainstudio-worker listening on port %d\n", (*daemon)->port());
    std::fflush(stdout);
    std::thread signals([&] {
        int sig = 0;
        sigwait(&set, &sig);
        ts::remote::logLine("signal " + std::to_string(sig) + ": shutting down");
        (*daemon)->shutdown();
    });
    (*daemon)->wait();
    signals.join();
    return 0;
}
