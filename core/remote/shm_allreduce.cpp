#include "remote/shm_allreduce.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include <csignal>

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace ts::remote {

namespace {
constexpr uint64_t kMagic = 0x54534d4852454431ull;  // "TSMHRED1"
constexpr std::size_t kHeaderBytes = 128;
constexpr std::size_t kCounterBytes = 64;
constexpr std::size_t kPage = 4096;
// How long a rank spins before it sleeps on the futex. Long enough to cover a peer that is a few
// microseconds behind (the common case between phases) without a sleep and a wake-up (tens of
// microseconds on a VM); short enough that ranks sharing a core with others do not burn it.
constexpr auto kSpin = std::chrono::microseconds(100);
// The longest a sleeping rank goes without calling poll (abort, the heartbeat's verdict).
constexpr long kPollNs = 5'000'000;

static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words must be plain 32-bit atomics");

long futexWait(std::atomic<uint32_t>* word, uint32_t expected, long ns)
{
    timespec ts{0, ns};
    return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futexWakeAll(std::atomic<uint32_t>* word)
{
    ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

inline void cpuRelax()
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}

// Sequence numbers wrap; every rank is within a few of the others.
bool reached(uint32_t value, uint32_t target) { return static_cast<int32_t>(value - target) >= 0; }

std::size_t alignUp(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }

std::size_t dataOffset(int size) { return alignUp(kHeaderBytes + kCounterBytes * static_cast<std::size_t>(size), kPage); }

std::size_t segmentBytes(int size)
{
    return dataOffset(size) + (static_cast<std::size_t>(size) + 1) * SharedMemoryAllReduce::kSlotFloats * sizeof(float);
}

std::string errnoText(int e) { return std::strerror(e); }

// A rank 0 killed between create() and unlink() (while the others attach) leaves its segment in
// /dev/shm. Names end in "-<pid>-<hex>": remove this user's whose process is gone, once they
// are old enough that no group can still be meeting through them.
void removeStaleSegments()
{
    namespace fs = std::filesystem;
    std::error_code ec;
    const auto now = fs::file_time_type::clock::now();
    for (const auto& entry : fs::directory_iterator("/dev/shm", ec)) {
        const std::string name = entry.path().filename().string();
        if (name.rfind("trainstudio-", 0) != 0) continue;
        const auto dash = name.rfind('-');
        const auto dash2 = dash == std::string::npos || dash == 0 ? std::string::npos : name.rfind('-', dash - 1);
        if (dash2 == std::string::npos) continue;
        const long pid = std::strtol(name.c_str() + dash2 + 1, nullptr, 10);
        struct stat st {};
        if (pid <= 0 || ::stat(entry.path().c_str(), &st) != 0 || st.st_uid != ::getuid()) continue;
        if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
        const auto mtime = fs::last_write_time(entry.path(), ec);
        if (ec || now - mtime < std::chrono::minutes(1)) continue;
        ::shm_unlink(("/" + name).c_str());
    }
}
} // namespace

struct SharedMemoryAllReduce::Header {
    uint64_t magic;
    uint64_t nonce;
    int32_t size;
    int32_t reserved;
    int64_t slotFloats;
    alignas(64) std::atomic<uint32_t> aborted;
};

// One per rank, on its own cache line: the rank's arrivals, and how many peers sleep on them.
struct SharedMemoryAllReduce::Counter {
    std::atomic<uint32_t> arrived;
    std::atomic<uint32_t> sleepers;
    int64_t length;  // the round's element count, written before arriving in phase 1
    int64_t total;   // the whole call's element count
};

Result<std::unique_ptr<SharedMemoryAllReduce>> SharedMemoryAllReduce::create(int size, const std::string& tag)
{
    if (size < 2) return makeError(ErrorCode::InvalidArgument, "a shared-memory all-reduce needs 2 or more ranks");
    removeStaleSegments();
    uint64_t nonce = 0;
    try {
        std::random_device rd;
        nonce = (uint64_t{rd()} << 32) ^ rd();
    } catch (const std::exception& e) {
        return makeError(ErrorCode::IoError, std::string("no random source for a shared-memory name: ") + e.what());
    }
    // The tag (the rendezvous group) only helps a person reading /dev/shm; the name must be a
    // single path component.
    std::string clean;
    for (char ch : tag.substr(0, 40)) clean += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
    char suffix[32];
    std::snprintf(suffix, sizeof suffix, "%d-%08x", static_cast<int>(::getpid()), static_cast<unsigned>(nonce));
    const std::string name = "/trainstudio-" + clean + "-" + suffix;
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return makeError(ErrorCode::IoError, "cannot create shared memory " + name + ": " + errnoText(errno));
    const std::size_t bytes = segmentBytes(size);
    // posix_fallocate reserves the pages now: tmpfs running out later would be a SIGBUS on first
    // touch instead of an error here.
    int err = ::ftruncate(fd, static_cast<off_t>(bytes)) == 0 ? 0 : errno;
    if (!err) err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    if (err) {
        ::close(fd);
        ::shm_unlink(name.c_str());
        return makeError(ErrorCode::IoError, "cannot size shared memory " + name + " to " + std::to_string(bytes) + " bytes: " + errnoText(err),
                         "free space in /dev/shm");
    }
    auto r = map(fd, name, 0, size);
    if (!r.ok()) {
        ::shm_unlink(name.c_str());
        return r;
    }
    (*r)->m_linked = true;
    Header* h = static_cast<Header*>((*r)->m_base);
    h->nonce = nonce;
    h->size = size;
    h->slotFloats = kSlotFloats;
    h->aborted.store(0, std::memory_order_relaxed);
    for (int i = 0; i < size; ++i) {
        (*r)->counter(i).arrived.store(0, std::memory_order_relaxed);
        (*r)->counter(i).sleepers.store(0, std::memory_order_relaxed);
    }
    std::atomic_ref<uint64_t>(h->magic).store(kMagic, std::memory_order_release);  // last: who sees it sees the rest
    return r;
}

Result<std::unique_ptr<SharedMemoryAllReduce>> SharedMemoryAllReduce::attach(const std::string& name, uint64_t nonce, int rank, int size)
{
    if (rank < 1 || rank >= size) return makeError(ErrorCode::InvalidArgument, "rank " + std::to_string(rank) + " cannot attach to a group of " + std::to_string(size));
    const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) return makeError(ErrorCode::IoError, "cannot open shared memory " + name + ": " + errnoText(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != segmentBytes(size)) {
        ::close(fd);
        return makeError(ErrorCode::IoError, "shared memory " + name + " has the wrong size");
    }
    TS_ASSIGN(auto r, map(fd, name, rank, size));
    Header* h = static_cast<Header*>(r->m_base);
    const uint64_t magic = std::atomic_ref<uint64_t>(h->magic).load(std::memory_order_acquire);
    // Same name, different segment: another IPC namespace (a container) or a stale leftover.
    if (magic != kMagic || h->nonce != nonce || h->size != size || h->slotFloats != kSlotFloats)
        return makeError(ErrorCode::IoError, "shared memory " + name + " is not this group's");
    return r;
}

Result<std::unique_ptr<SharedMemoryAllReduce>> SharedMemoryAllReduce::map(int fd, const std::string& name, int rank, int size)
{
    static_assert(sizeof(Header) <= kHeaderBytes && sizeof(Counter) <= kCounterBytes);
    const std::size_t bytes = segmentBytes(size);
    void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int err = errno;
    ::close(fd);
    if (base == MAP_FAILED) return makeError(ErrorCode::IoError, "cannot map shared memory " + name + ": " + errnoText(err));
    std::unique_ptr<SharedMemoryAllReduce> s(new SharedMemoryAllReduce);
    s->m_name = name;
    s->m_rank = rank;
    s->m_size = size;
    s->m_base = base;
    s->m_bytes = bytes;
    return s;
}

SharedMemoryAllReduce::~SharedMemoryAllReduce()
{
    unlink();
    if (m_base) ::munmap(m_base, m_bytes);
}

uint64_t SharedMemoryAllReduce::nonce() const { return static_cast<const Header*>(m_base)->nonce; }

void SharedMemoryAllReduce::unlink()
{
    if (m_linked) ::shm_unlink(m_name.c_str());
    m_linked = false;
}

SharedMemoryAllReduce::Counter& SharedMemoryAllReduce::counter(int r) const
{
    return *reinterpret_cast<Counter*>(static_cast<char*>(m_base) + kHeaderBytes + kCounterBytes * static_cast<std::size_t>(r));
}

float* SharedMemoryAllReduce::slot(int r) const
{
    return reinterpret_cast<float*>(static_cast<char*>(m_base) + dataOffset(m_size)) + static_cast<std::size_t>(r) * kSlotFloats;
}

float* SharedMemoryAllReduce::result() const { return slot(m_size); }

bool SharedMemoryAllReduce::aborted() const { return static_cast<const Header*>(m_base)->aborted.load(std::memory_order_acquire) != 0; }

void SharedMemoryAllReduce::abort()
{
    static_cast<Header*>(m_base)->aborted.store(1, std::memory_order_seq_cst);
    for (int r = 0; r < m_size; ++r) futexWakeAll(&counter(r).arrived);
}

void SharedMemoryAllReduce::arrive(uint32_t value)
{
    Counter& c = counter(m_rank);
    // seq_cst on both sides (here and in waitAll) so that either the sleeper sees the new value
    // or this rank sees the sleeper and wakes it.
    c.arrived.store(value, std::memory_order_seq_cst);
    if (c.sleepers.load(std::memory_order_seq_cst) != 0) futexWakeAll(&c.arrived);
}

Status SharedMemoryAllReduce::waitAll(uint32_t target, const Poll& poll, std::chrono::steady_clock::time_point deadline,
                                      const std::function<std::string(int)>& peerName)
{
    auto abortedError = [] { return makeError(ErrorCode::Cancelled, "a rank aborted the shared-memory all-reduce"); };
    for (int r = 0; r < m_size; ++r) {
        if (r == m_rank) continue;
        Counter& c = counter(r);
        const auto spinUntil = std::chrono::steady_clock::now() + kSpin;
        for (unsigned i = 1; !reached(c.arrived.load(std::memory_order_acquire), target); ++i) {
            if (aborted()) return abortedError();
            cpuRelax();
            if (i % 256 == 0 && std::chrono::steady_clock::now() >= spinUntil) break;
        }
        while (true) {
            c.sleepers.fetch_add(1, std::memory_order_seq_cst);
            const uint32_t v = c.arrived.load(std::memory_order_seq_cst);
            if (!reached(v, target) && !aborted()) futexWait(&c.arrived, v, kPollNs);
            c.sleepers.fetch_sub(1, std::memory_order_seq_cst);
            if (reached(c.arrived.load(std::memory_order_acquire), target)) break;
            if (aborted()) return abortedError();
            TS_TRY(poll());
            if (std::chrono::steady_clock::now() >= deadline)
                return makeError(ErrorCode::IoError, "timed out waiting for " + peerName(r) + " in the shared-memory all-reduce");
        }
    }
    // The peers' writes to their slots and the result happen before their arrival: see them.
    std::atomic_thread_fence(std::memory_order_acquire);
    return okStatus();
}

Status SharedMemoryAllReduce::allReduceSum(float* data, int64_t n, const Poll& poll, std::chrono::milliseconds timeout,
                                           const std::function<std::string(int)>& peerName)
{
    if (aborted()) return makeError(ErrorCode::Cancelled, "a rank aborted the shared-memory all-reduce");
    float* mine = slot(m_rank);
    float* sum = result();
    for (int64_t off = 0; off < n; off += kSlotFloats) {
        const int64_t len = std::min(kSlotFloats, n - off);
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        // Phase 1: publish this rank's part. Its slot is free: every peer finished reading the
        // slots (phase 2 of the previous round) before this rank's last wait ended.
        std::memcpy(mine, data + off, static_cast<std::size_t>(len) * sizeof(float));
        counter(m_rank).length = len;
        counter(m_rank).total = n;
        arrive(++m_seq);
        TS_TRY(waitAll(m_seq, poll, deadline, peerName));
        // Ranks that disagree on the size would sum misaligned parts (and the TCP ring would have
        // failed): every rank sees every size, so each stops here with the same verdict.
        for (int r = 0; r < m_size; ++r)
            if (counter(r).length != len || counter(r).total != n) {
                abort();
                return makeError(ErrorCode::InvalidArgument,
                                 "the ranks all-reduce different sizes: " + peerName(m_rank) + " has " + std::to_string(n) + " floats, " +
                                     peerName(r) + " has " + std::to_string(counter(r).total),
                                 "every task must train the same model (check that all were started with the same model and configuration)");
            }
        // Phase 2: sum part m_rank of every slot, in rank order. The result area is free: every
        // peer copied the previous result out before it arrived in phase 1.
        const int64_t lo = len * m_rank / m_size, hi = len * (m_rank + 1) / m_size;
        {
            const float* s0 = slot(0);
            const float* s1 = slot(1);
            float* out = sum;
            for (int64_t i = lo; i < hi; ++i) out[i] = s0[i] + s1[i];
            for (int k = 2; k < m_size; ++k) {
                const float* sk = slot(k);
                for (int64_t i = lo; i < hi; ++i) out[i] += sk[i];
            }
        }
        arrive(++m_seq);
        TS_TRY(waitAll(m_seq, poll, deadline, peerName));
        // Phase 3: take the whole sum.
        std::memcpy(data + off, sum, static_cast<std::size_t>(len) * sizeof(float));
    }
    return okStatus();
}

} // namespace ts::remote
