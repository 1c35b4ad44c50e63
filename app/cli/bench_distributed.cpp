// trainstudio-cli bench --suite distributed: the Gloo all-reduce path (latency and bandwidth from
// the MLP's 0.8 MB of gradients to 64 MiB, two ranks on loopback) and MultiWorkerMirrored
// throughput on the seed's MLP: 2 worker processes x 1 thread vs 1 process x 2 threads, next to
// PyTorch DDP over gloo (../shared/bench/torch_ddp.py) run in the same invocation, alternating;
// then ParameterServer on the same model (2 worker daemons and a ps daemon on loopback).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <filesystem>
#include <future>
#include <iostream>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "commands.h"
#include "remote/gloo_communicator.h"
#include "remote/rendezvous.h"

namespace tscli {
namespace {

using Clock = std::chrono::steady_clock;

int freeLoopbackPort()
{
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);
    return ntohs(a.sin_port);
}

// Runs a shell command; returns its output.
std::string capture(const std::string& cmd)
{
    std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
    std::string all;
    if (!pipe) return all;
    std::array<char, 4096> buf{};
    while (fgets(buf.data(), static_cast<int>(buf.size()), pipe.get())) all += buf.data();
    return all;
}

// Median samples/s of epochs 2..N from our --json epoch lines (or torch's last line).
double epochRate(const std::string& output)
{
    std::vector<double> rates;
    std::istringstream in(output);
    std::string line;
    while (std::getline(in, line)) {
        auto j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.is_object() || j.value("final", false)) continue;
        if (j.contains("epoch") && j.contains("samples_per_sec") && j["samples_per_sec"].is_number()) rates.push_back(j["samples_per_sec"].get<double>());
        else if (j.contains("framework")) return j.value("samples_per_sec", 0.0);
    }
    if (rates.size() > 1) rates.erase(rates.begin());  // the first epoch warms up
    return median(rates);
}

struct AllReduceRow {
    std::size_t bytes;
    double medianMs, gbPerSec;
    double cpuMs;  // rank 0's thread CPU time (user + system) per all-reduce, median
};

double threadCpuMs()
{
    timespec ts{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

ts::Result<std::vector<AllReduceRow>> allReduceSweep()
{
    ts::remote::RendezvousServer::Options so;
    so.token = "bench";
    TS_ASSIGN(auto server, ts::remote::RendezvousServer::start(so));
    std::vector<std::future<ts::Result<std::unique_ptr<ts::Communicator>>>> fs;
    for (int r = 0; r < 2; ++r)
        fs.push_back(std::async(std::launch::async, [&, r] {
            ts::remote::GlooOptions g;
            g.rank = r;
            g.size = 2;
            g.rendezvousAddress = "127.0.0.1:" + std::to_string(server->port());
            g.token = "bench";
            g.group = "bench";
            return ts::remote::makeGlooCommunicator(g);
        }));
    std::vector<std::unique_ptr<ts::Communicator>> comms;
    for (auto& f : fs) {
        auto c = f.get();
        if (!c.ok()) return c.takeError();
        comms.push_back(std::move(c).value());
    }
    std::vector<AllReduceRow> rows;
    // 203530 floats: the seed MLP's gradients (784*256 + 256 + 256*10 + 10).
    for (int64_t n : {int64_t{203530}, int64_t{1} << 20, int64_t{4} << 20, int64_t{16} << 20}) {
        std::vector<double> times, cpu;
        auto run = [&](int r) -> ts::Status {
            ts::Tensor t = ts::Tensor::zeros({n});
            const auto start = Clock::now();
            for (int i = 0; i < 200; ++i) {
                const auto t0 = Clock::now();
                const double c0 = threadCpuMs();
                TS_TRY(comms[static_cast<std::size_t>(r)]->allReduceSum(r, t));
                if (r == 0 && i >= 3) {
                    times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
                    cpu.push_back(threadCpuMs() - c0);
                }
                // Both ranks stop together: the iteration count is decided before the timing cap.
                if (i >= 10 && std::chrono::duration<double>(Clock::now() - start).count() > 2.0 && i % 10 == 9) {
                    ts::Tensor stop = ts::Tensor::fromVector({1}, {1.f});
                    TS_TRY(comms[static_cast<std::size_t>(r)]->allReduceSum(r, stop));
                    if (stop.data<float>()[0] > 0) break;
                } else if (i >= 10 && i % 10 == 9) {
                    ts::Tensor stop = ts::Tensor::fromVector({1}, {0.f});
                    TS_TRY(comms[static_cast<std::size_t>(r)]->allReduceSum(r, stop));
                    if (stop.data<float>()[0] > 0) break;
                }
            }
            return ts::okStatus();
        };
        auto other = std::async(std::launch::async, run, 1);
        ts::Status a = run(0);
        ts::Status b = other.get();
        if (!a.ok()) return a.takeError();
        if (!b.ok()) return b.takeError();
        const double ms = median(times);
        const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(float);
        rows.push_back({bytes, ms, static_cast<double>(bytes) / (ms / 1e3) / 1e9, median(cpu)});
    }
    return rows;
}

// trainstudio-worker next to this binary: the same folder once installed, app/worker in a build.
std::string workerBinary(const std::string& self)
{
    namespace fs = std::filesystem;
    const fs::path dir = fs::path(self).parent_path();
    for (const fs::path& p : {dir / "trainstudio-worker", dir.parent_path() / "worker" / "trainstudio-worker"}) {
        std::error_code ec;
        if (fs::is_regular_file(p, ec)) return p.string();
    }
    return {};
}

// One parameter-server run: 3 daemons on loopback (ps:0, worker:0, worker:1), this binary
// coordinating; the daemons are stopped after. Returns the run's samples/s (0 if it failed): the
// median of epochs 2..N, as for the multi-worker runs (ps:0's epochs count every worker's).
double parameterServerRate(const std::string& self, const std::string& worker, const std::string& common)
{
    std::ostringstream cmd;
    cmd << "export TRAINSTUDIO_TOKEN=bench-" << ::getpid() << " OMP_NUM_THREADS=1; unset TF_CONFIG; d=$(mktemp -d); pids=; "
        << "for n in ps0 w0 w1; do '" << worker << "' --listen 127.0.0.1:0 --name $n --port-file $d/$n.port >/dev/null 2>&1 & pids=\"$pids $!\"; done; "
        << "for n in ps0 w0 w1; do i=0; while [ ! -s $d/$n.port ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i+1)); done; done; "
        << "printf '{\"cluster\": {\"worker\": [\"127.0.0.1:%s\", \"127.0.0.1:%s\"], \"ps\": [\"127.0.0.1:%s\"]}}' "
        << "$(cat $d/w0.port) $(cat $d/w1.port) $(cat $d/ps0.port) > $d/cluster.json; '" << self << "'" << common
        << " --strategy parameter-server --cluster $d/cluster.json 2>&1; kill $pids 2>/dev/null; wait; rm -rf $d";
    return epochRate(capture(cmd.str()));
}

} // namespace

int distributedSuite(const BenchOptions& o)
{
    // 1. The collective alone.
    auto sweep = allReduceSweep();
    if (!sweep.ok()) {
        std::cerr << "error: " << sweep.error().toString() << "\n";
        return 1;
    }
    nlohmann::json out;
    out["suite"] = "distributed";
    for (const auto& r : *sweep) {
        out["allreduce"].push_back({{"bytes", r.bytes}, {"median_ms", r.medianMs}, {"algorithm_gb_per_sec", r.gbPerSec}, {"cpu_ms", r.cpuMs}});
        if (!o.json)
            std::printf("gloo all-reduce, 2 ranks on loopback: %8.2f MB  median %7.2f ms  %5.2f GB/s  (CPU of one rank: %.2f ms)\n",
                        static_cast<double>(r.bytes) / 1e6, r.medianMs, r.gbPerSec, r.cpuMs);
    }
    std::fflush(stdout);

    // 2. Training throughput: A = 2 workers x 1 thread, B = 1 process x 2 threads, C = DDP.
    const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    const std::string dir = o.torchDir.empty() ? std::string(TS_BENCH_DIR) : o.torchDir;
    const bool torch = !o.noTorch && std::filesystem::exists(std::filesystem::path(dir) / "torch_ddp.py");
    if (!o.noTorch && !torch) std::cerr << "note: " << dir << "/torch_ddp.py not found; measuring TrainStudio only (pass --torch-dir)\n";
    const int epochs = std::max(2, o.epochs);
    const std::string common = " train --model mlp --batch-size 256 --no-validation --no-record --json --epochs " + std::to_string(epochs) +
                               (o.limit > 0 ? " --limit " + std::to_string(o.limit) : std::string());
    std::vector<double> multi, single, ddp, ratioSingle, ratioDdp;
    for (int pair = 0; pair < std::max(1, o.pairs); ++pair) {
        const int p0 = freeLoopbackPort(), p1 = freeLoopbackPort();
        const std::string tf = "{\"cluster\": {\"chief\": [\"127.0.0.1:" + std::to_string(p0) + "\"], \"worker\": [\"127.0.0.1:" +
                               std::to_string(p1) + "\"]}}";
        std::ostringstream cmd;
        cmd << "export TRAINSTUDIO_TOKEN=bench-" << ::getpid() << " TF_CONFIG='" << tf << "'; '" << self << "'" << common
            << " --strategy multi-worker-mirrored --threads 1 --task worker:0 >/dev/null 2>&1 & '" << self << "'" << common
            << " --strategy multi-worker-mirrored --threads 1 --task chief:0 2>&1; wait";
        const double a = epochRate(capture(cmd.str()));
        const double b = epochRate(capture("'" + self + "'" + common + " --strategy one-device --threads 2 2>&1"));
        multi.push_back(a);
        single.push_back(b);
        if (b > 0) ratioSingle.push_back(a / b);
        std::string line = "pair " + std::to_string(pair + 1) + ": 2 workers x 1 thread " + std::to_string(static_cast<long>(a)) +
                           " samples/s, 1 process x 2 threads " + std::to_string(static_cast<long>(b));
        if (torch) {
            std::ostringstream t;
            t << "cd '" << dir << "' && env -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY -u TS_NO_REEXEC -u TF_CONFIG "
              << "LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp OPENBLAS_CORETYPE=" << openblasCoreType() << " OMP_NUM_THREADS=1 "
              << o.python << " torch_ddp.py --world 2 --threads 1 --epochs " << epochs << " --port " << freeLoopbackPort() << " 2>&1";
            const double c = epochRate(capture(t.str()));
            ddp.push_back(c);
            if (c > 0) ratioDdp.push_back(a / c);
            line += ", pytorch ddp " + std::to_string(static_cast<long>(c));
        }
        if (!o.json) std::printf("%s\n", line.c_str());
        std::fflush(stdout);
    }
    // 3. ParameterServer: 2 workers x 1 thread and 1 ps task, each a daemon (asynchronous, no
    // reference to set it against: TF's ParameterServerStrategy is not in the bench's PyTorch).
    const std::string worker = workerBinary(self);
    std::vector<double> ps;
    if (worker.empty()) {
        std::cerr << "note: trainstudio-worker is not next to this binary; the parameter-server run is not measured\n";
    } else {
        for (int pair = 0; pair < std::max(1, o.pairs); ++pair) {
            ps.push_back(parameterServerRate(self, worker, common));
            if (!o.json) std::printf("parameter server %d: 2 workers x 1 thread + 1 ps task %ld samples/s\n", pair + 1, static_cast<long>(ps.back()));
            std::fflush(stdout);
        }
        out["parameter_server_samples_per_sec"] = median(ps);
    }
    out["multi_worker_samples_per_sec"] = median(multi);
    out["one_process_2_threads_samples_per_sec"] = median(single);
    out["ratio_vs_one_process"] = median(ratioSingle);
    if (torch) {
        out["pytorch_ddp_samples_per_sec"] = median(ddp);
        out["ratio_vs_pytorch_ddp"] = median(ratioDdp);
    }
    if (o.json) {
        std::cout << out.dump() << "\n";
    } else {
        std::printf("MLP, 2 workers x 1 thread: %.0f samples/s | 1 process x 2 threads: %.0f (ratio %.2fx)", median(multi), median(single),
                    median(ratioSingle));
        if (torch) std::printf(" | PyTorch DDP 2x1: %.0f (ratio %.2fx)", median(ddp), median(ratioDdp));
        std::printf("\n");
        if (!ps.empty())
            std::printf("MLP, parameter server (2 workers x 1 thread, 1 ps): %.0f samples/s (%.2fx the 2 multi-worker-mirrored workers)\n",
                        median(ps), median(multi) > 0 ? median(ps) / median(multi) : 0.0);
    }
    return 0;
}

} // namespace tscli
