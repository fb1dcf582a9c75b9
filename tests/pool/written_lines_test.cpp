// The cache lines the pool's common path writes, recorded exactly, for two streams driven by two
// threads: they must share none. Every allocation of this program comes from one arena (the global
// operator new below); while a stream's calls are recorded the arena is read-only, each write
// faults, the handler notes its address and thread, lets that one instruction run (the trap flag)
// and makes the page read-only again. x86-64 Linux, without sanitizers (which own these signals).
#include <custody/platform/host.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/host_memory.hpp>

#include "../support/catch.hpp"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <set>
#include <thread>
#include <vector>

#if defined(__x86_64__) && defined(__linux__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define CUSTODY_LINES_RECORDED 1
#include <csignal>
#include <dlfcn.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>
#endif

namespace {

#ifdef CUSTODY_LINES_RECORDED

// ---- the arena every allocation comes from (nothing is given back) --------------------------------

constexpr std::size_t arena_bytes = std::size_t{1} << 30;
constexpr std::size_t page = 4096;
char* arena_base = nullptr;
std::atomic<std::size_t> arena_used{0};

void* arena_take(std::size_t n, std::size_t alignment) {
    if (arena_base == nullptr) {
        void* p = ::mmap(nullptr, arena_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) std::abort();
        arena_base = static_cast<char*>(p);
    }
    alignment = std::max<std::size_t>(alignment, 16);
    std::size_t at = arena_used.load(std::memory_order_relaxed);
    std::size_t start = 0;
    do {
        start = (at + alignment - 1) & ~(alignment - 1);
    } while (!arena_used.compare_exchange_weak(at, start + std::max<std::size_t>(n, 1)));
    if (start + n > arena_bytes) std::abort();
    return arena_base + start;
}

// ---- the recorder -------------------------------------------------------------------------------

struct write_record {
    std::uintptr_t address;
    long thread;
    std::uintptr_t instruction; ///< where the write is (to name it when a line is shared)
};
constexpr std::size_t most_records = 1 << 20;
write_record records[most_records];
std::atomic<std::size_t> record_count{0};
thread_local std::uintptr_t open_page = 0; ///< the page a write of this thread is being let through

long this_thread() { return static_cast<long>(::syscall(SYS_gettid)); }

void on_fault(int, siginfo_t* info, void* context) {
    const auto address = reinterpret_cast<std::uintptr_t>(info->si_addr);
    const auto base = reinterpret_cast<std::uintptr_t>(arena_base);
    if (address < base || address >= base + arena_bytes) { // not ours: crash as usual
        std::signal(SIGSEGV, SIG_DFL);
        return;
    }
    const std::size_t i = record_count.fetch_add(1, std::memory_order_relaxed);
    auto* uc = static_cast<ucontext_t*>(context);
    if (i < most_records) records[i] = {address, this_thread(), static_cast<std::uintptr_t>(uc->uc_mcontext.gregs[REG_RIP])};
    open_page = address & ~(page - 1);
    ::mprotect(reinterpret_cast<void*>(open_page), page, PROT_READ | PROT_WRITE);
    uc->uc_mcontext.gregs[REG_EFL] |= 0x100; // trap after one instruction
}

void on_step(int, siginfo_t*, void* context) {
    ::mprotect(reinterpret_cast<void*>(open_page), page, PROT_READ);
    static_cast<ucontext_t*>(context)->uc_mcontext.gregs[REG_EFL] &= ~0x100LL;
}

/// Records the writes into the arena while it lives (the arena read-only meanwhile).
class recording {
public:
    recording() {
        struct sigaction a = {};
        a.sa_sigaction = on_fault;
        a.sa_flags = SA_SIGINFO | SA_NODEFER;
        ::sigaction(SIGSEGV, &a, &old_segv_);
        a.sa_sigaction = on_step;
        ::sigaction(SIGTRAP, &a, &old_trap_);
        record_count.store(0);
        used_ = (arena_used.load() + page - 1) & ~(page - 1);
        ::mprotect(arena_base, used_, PROT_READ);
    }
    ~recording() {
        ::mprotect(arena_base, used_, PROT_READ | PROT_WRITE);
        ::sigaction(SIGSEGV, &old_segv_, nullptr);
        ::sigaction(SIGTRAP, &old_trap_, nullptr);
    }
    recording(const recording&) = delete;
    recording& operator=(const recording&) = delete;

private:
    std::size_t used_ = 0;
    struct sigaction old_segv_ = {};
    struct sigaction old_trap_ = {};
};

/// The cache lines thread `thread` wrote during the last recording.
std::set<std::uintptr_t> lines_of(long thread) {
    std::set<std::uintptr_t> lines;
    const std::size_t n = std::min(record_count.load(), most_records);
    for (std::size_t i = 0; i < n; ++i) {
        if (records[i].thread == thread) lines.insert(records[i].address / 64);
    }
    return lines;
}

#endif

} // namespace

#ifdef CUSTODY_LINES_RECORDED
void* operator new(std::size_t n) { return arena_take(n, 16); }
void* operator new[](std::size_t n) { return arena_take(n, 16); }
void* operator new(std::size_t n, std::align_val_t a) { return arena_take(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return arena_take(n, static_cast<std::size_t>(a)); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return arena_take(n, 16); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return arena_take(n, 16); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
    return arena_take(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
    return arena_take(n, static_cast<std::size_t>(a));
}
void operator delete(void*) noexcept {}
void operator delete[](void*) noexcept {}
void operator delete(void*, std::size_t) noexcept {}
void operator delete[](void*, std::size_t) noexcept {}
void operator delete(void*, std::align_val_t) noexcept {}
void operator delete[](void*, std::align_val_t) noexcept {}
void operator delete(void*, std::size_t, std::align_val_t) noexcept {}
void operator delete[](void*, std::size_t, std::align_val_t) noexcept {}
#endif

TEST_CASE("two threads on their own streams write no cache line in common on the pool's common path",
          "[pool][threads][lines]") {
#ifndef CUSTODY_LINES_RECORDED
    WARN("the recorder needs x86-64 Linux without sanitizers: not run");
#else
    using pool_type = custody::pool::stream_ordered_pool<custody::resource::host_memory>;
    custody::pool::pool_options o;
    o.checked = false;
    o.annotate = false;
    auto* pool = new pool_type(o);
    auto* a = new custody::host::stream;
    auto* b = new custody::host::stream;
    constexpr std::size_t sizes[] = {256, 4096, 65536, 1 << 20};
    // Each stream's hot stacks and credit made first (the careful path), then only the common path.
    const auto pairs = [&](custody::host::stream_view s, int n) {
        for (int i = 0; i < n; ++i) {
            for (std::size_t bytes : sizes) {
                void* p = pool->allocate(s, bytes, 256);
                pool->deallocate(s, p, bytes, 256);
            }
        }
    };
    const auto burst = [&](custody::host::stream_view s) { // four live at once, given back in turn
        void* held[4 * std::size(sizes)]; // on the stack: the test's own writes stay out of the arena
        for (std::size_t i = 0; i < std::size(held); ++i) held[i] = pool->allocate(s, sizes[i / 4], 256);
        for (std::size_t i = 0; i < std::size(held); ++i) pool->deallocate(s, held[i], sizes[i / 4], 256);
    };
    // A steady state: the streams' live memory stays below the peak they reached together, so that
    // each stream's credit covers its own bursts (peak_counter: a stream that allocates past its
    // credit while the pool is at its peak takes another's, which is not the common path).
    for (int round = 0; round < 8; ++round) {
        void* held[2][4 * std::size(sizes)];
        for (int k = 0; k < 2; ++k) {
            for (std::size_t i = 0; i < std::size(held[k]); ++i) held[k][i] = pool->allocate(k == 0 ? *a : *b, sizes[i / 4], 256);
        }
        for (int k = 0; k < 2; ++k) {
            for (std::size_t i = 0; i < std::size(held[k]); ++i) pool->deallocate(k == 0 ? *a : *b, held[k][i], sizes[i / 4], 256);
        }
    }
    pairs(a->view(), 4);
    pairs(b->view(), 4);
    const auto before = pool->detailed_statistics();
    // Threads made before the arena turns read-only (making one allocates); each runs its calls
    // when `go` reaches its turn, one after the other, so that one thread's write let through
    // never hides another's.
    std::atomic<int> go{0};
    long ids[2] = {0, 0};
    const auto driver = [&](int who, int turn, custody::host::stream_view s) {
        return std::thread([&, who, turn, s] {
            ids[who] = this_thread();
            while (go.load() != turn) std::this_thread::yield();
            pairs(s, 100);
            burst(s);
            go.store(turn + 1);
        });
    };
    const auto record = [&](custody::host::stream_view first, custody::host::stream_view second, bool explain) {
        go.store(0);
        std::thread t0 = driver(0, 1, first);
        std::thread t1 = driver(1, 2, second);
        {
            const recording r;
            go.store(1);
            t0.join();
            t1.join();
        }
        std::vector<std::uintptr_t> shared;
        const std::set<std::uintptr_t> on0 = lines_of(ids[0]), on1 = lines_of(ids[1]);
        std::set_intersection(on0.begin(), on0.end(), on1.begin(), on1.end(), std::back_inserter(shared));
        INFO("lines written: first thread " << on0.size() << ", second " << on1.size());
        for (std::uintptr_t line : explain ? shared : std::vector<std::uintptr_t>{}) {
            for (std::size_t i = 0; i < std::min(record_count.load(), most_records); ++i) {
                if (records[i].address / 64 == line) {
                    Dl_info where = {};
                    ::dladdr(reinterpret_cast<void*>(records[i].instruction), &where);
                    std::fprintf(stderr, "shared line %#lx: written at %#lx by thread %ld from %s+%#lx\n",
                                 static_cast<unsigned long>(line * 64), static_cast<unsigned long>(records[i].address),
                                 records[i].thread, where.dli_fname == nullptr ? "?" : where.dli_fname,
                                 static_cast<unsigned long>(records[i].instruction -
                                                            reinterpret_cast<std::uintptr_t>(where.dli_fbase)));
                    break;
                }
            }
        }
        REQUIRE(!on0.empty()); // the recorder saw the writes (a lock, a stack, a credit at least)
        REQUIRE(!on1.empty());
        return shared.size();
    };
    CHECK(record(a->view(), b->view(), true) == 0); // a shared line is named on stderr, with its writer
    // Only the common path ran: every allocation came from a hot stack.
    const auto after = pool->detailed_statistics();
    const std::uint64_t calls = 2 * (100 + 4) * std::size(sizes);
    CHECK(after.fast_allocations - before.fast_allocations == calls);
    CHECK(after.totals.allocations - before.totals.allocations == calls);
    // The control: two threads on one stream share its lines, and the recorder says so.
    CHECK(record(a->view(), a->view(), false) > 0);
    delete b;
    delete a;
    delete pool;
#endif
}
