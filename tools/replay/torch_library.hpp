/// @file
/// The replay through the allocator library PyTorch loads (plugins/torch): its C functions, taken
/// with dlopen and dlsym as PyTorch's CUDAPluggableAllocator takes them, called as PyTorch calls
/// them, so that custody-replay measures the route a PyTorch user is on (allocator `torch_library`).
#pragma once

#include "allocators.hpp"
#include "allocator_spec.hpp"
#include "program.hpp"
#include "replay.hpp"
#include "streams.hpp"

#include <custody/platform/host.hpp>

#include <dlfcn.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#ifndef CUSTODY_REPLAY_TORCH_LIBRARY
#define CUSTODY_REPLAY_TORCH_LIBRARY "" // the build tree's host build of the library, set by meson
#endif

namespace custody::replay {

inline constexpr allocator_info torch_library_info{
    "torch_library", "host",
    "the allocator library PyTorch loads (plugins/torch), through its C functions as PyTorch's "
    "CUDAPluggableAllocator calls them: custody_torch_malloc and custody_free per block, custody_empty_cache where "
    "the trace shows PyTorch giving segments back; the host build here, the CUDA build on a GPU",
    "path, max_bytes, chunked=0|1, empty_cache=trace|never"};

/// The library's C functions, from one dlopen of its file. Loaded once per file and kept for the
/// process (never closed: its pools live as long as the process, as under PyTorch).
struct torch_library {
    struct stats {
        std::uint64_t live_bytes, peak_live_bytes, reserved_bytes, peak_reserved_bytes, live_allocations, allocations,
            deallocations, num_ooms, held_bytes;
    };
    void* (*malloc)(ssize_t, int, void*) = nullptr; ///< custody_torch_malloc: PyTorch's alloc function (throws)
    void (*free)(void*, ssize_t, int, void*) = nullptr;
    std::size_t (*empty_cache)() = nullptr;
    int (*stats_of)(int, stats*) = nullptr;
    int (*configure)(const char*, std::uint64_t) = nullptr;
    std::size_t (*report)(char*, std::size_t) = nullptr;
    const char* (*last_error)() = nullptr;
    const char* (*platform)() = nullptr;
    int (*device_count)() = nullptr;
    std::string path;
    std::string options;         ///< the options asked for (a second use must ask for the same)
    std::string options_applied; ///< set once they were configured

    /// The library at `path`, loaded as PyTorch loads it (ctypes.CDLL: RTLD_NOW | RTLD_LOCAL), or
    /// the one already loaded from it. Throws spec_error through `spec` when it cannot be loaded or
    /// lacks a function, or was loaded already with other options (its pools are configured once).
    static torch_library& load(const std::string& path, const std::string& options, const allocator_spec& spec) {
        static std::mutex mutex;
        static auto* const loaded = new std::map<std::string, std::unique_ptr<torch_library>>;
        std::lock_guard lock(mutex);
        auto& slot = (*loaded)[path];
        if (slot) {
            if (slot->options != options) {
                spec.fail("the library " + path + " is loaded already with other options (" + slot->options +
                          "); a process configures it once: replay the other options in a run of their own");
            }
            return *slot;
        }
        void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (handle == nullptr) spec.fail("cannot load " + path + ": " + ::dlerror());
        auto lib = std::make_unique<torch_library>();
        const auto bind = [&](auto& f, const char* name) {
            f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(::dlsym(handle, name));
            if (f == nullptr) spec.fail(path + " has no " + name + " (not custody's allocator library?)");
        };
        bind(lib->malloc, "custody_torch_malloc");
        bind(lib->free, "custody_free");
        bind(lib->empty_cache, "custody_empty_cache");
        bind(lib->stats_of, "custody_stats");
        bind(lib->configure, "custody_configure");
        bind(lib->report, "custody_report");
        bind(lib->last_error, "custody_last_error");
        bind(lib->platform, "custody_platform");
        bind(lib->device_count, "custody_device_count");
        lib->path = path;
        lib->options = options;
        slot = std::move(lib);
        return *slot;
    }

    [[nodiscard]] bool host() const { return std::string_view(platform()) == "host"; }
};

/// The operations before which the trace shows PyTorch giving segments back (its reserved bytes
/// fall: the program called torch.cuda.empty_cache(), or PyTorch's own out-of-memory retry did),
/// in order: where the route calls custody_empty_cache, as PyTorch calls its allocator's reset.
[[nodiscard]] inline std::vector<std::size_t> segment_releases(const device_program& p) {
    std::vector<std::size_t> at;
    if (!p.reference) return at;
    std::uint64_t before = 0;
    for (const auto& [k, v] : p.reference->points) {
        if (v < before && k < p.ops.size()) at.push_back(k);
        before = v;
    }
    return at;
}

/// One replay through the library. Each call is PyTorch's (torch/csrc/cuda/CUDAPluggableAllocator.cpp):
/// custody_torch_malloc(size, device, stream) for an allocation (malloc: the stream is the one the
/// trace names, PyTorch's default stream being NULL); custody_free(ptr, size, device, stream) with
/// the size, device and stream the allocation had, kept per block as PyTorch keeps them
/// (raw_delete, from allocation_metadata_), whatever stream the trace's free names; and
/// custody_empty_cache() before each operation in `releases` (emptyCache). The trace's alignment is
/// not passed: PyTorch passes none.
///
/// The op counter that places the empty_cache calls counts allocate and deallocate calls; the replay
/// skips the free of an allocation that failed, so after a failure the calls may come up to that
/// many operations late (a failure is reported anyway). The library's state is the process's: the
/// first replay starts from a fresh library, each later one from a library emptied by
/// custody_empty_cache when the previous one ended.
template <class StreamArg>
class torch_library_adaptor {
public:
    torch_library_adaptor(torch_library& lib, int device, std::vector<void*> streams, std::vector<std::size_t> releases)
        : lib_(lib), device_(device), streams_(std::move(streams)), releases_(std::move(releases)) {}
    torch_library_adaptor(const torch_library_adaptor&) = delete;
    torch_library_adaptor& operator=(const torch_library_adaptor&) = delete;
    /// Empties the library for the next replay (the replay gave back every block before).
    ~torch_library_adaptor() { static_cast<void>(lib_.empty_cache()); }

    void* allocate(std::uint16_t stream, std::uint64_t bytes, std::size_t) noexcept {
        step();
        try {
            void* p = lib_.malloc(static_cast<ssize_t>(bytes), device_, streams_[stream]);
            if (p == nullptr) {
                failure_ = "custody_torch_malloc returned NULL for " + std::to_string(bytes) + " bytes";
                return nullptr;
            }
            try {
                metadata_.insert_or_assign(p, block{static_cast<ssize_t>(bytes), streams_[stream]});
            } catch (...) {
                lib_.free(p, static_cast<ssize_t>(bytes), device_, streams_[stream]);
                throw;
            }
            return p;
        } catch (const std::exception& e) {
            failure_ = e.what();
        } catch (...) {
            failure_ = "an unknown exception";
        }
        return nullptr;
    }
    void deallocate(std::uint16_t, void* p, std::uint64_t, std::size_t) noexcept {
        step();
        const auto it = metadata_.find(p);
        if (it == metadata_.end()) return; // not reached: the replay frees only what it allocated
        const block b = it->second;
        metadata_.erase(it);
        lib_.free(p, b.size, device_, b.stream);
    }
    [[nodiscard]] std::uint64_t reserved() const { return counters().reserved_bytes; }
    /// The largest free block the library's report gives for the device, when it gives one.
    [[nodiscard]] std::optional<std::uint64_t> largest_free() const {
        std::string text(lib_.report(nullptr, 0) + 1, '\0');
        text.resize(std::min(text.size() - 1, lib_.report(text.data(), text.size())));
        const std::string line_start = "custody device " + std::to_string(device_) + " ";
        const std::size_t line = text.find(line_start);
        const std::string_view key = "largest free block ";
        const std::size_t at = line == std::string::npos ? line : text.find(key, line);
        if (at == std::string::npos) return std::nullopt;
        return std::strtoull(text.c_str() + at + key.size(), nullptr, 10);
    }
    [[nodiscard]] std::optional<std::uint64_t> peak_live() const { return counters().peak_live_bytes; }
    void settle() {
        for (void* s : streams_) {
            if (s != nullptr) StreamArg::synchronize(s);
        }
    }
    [[nodiscard]] const std::string& failure() const noexcept { return failure_; }

private:
    [[nodiscard]] torch_library::stats counters() const {
        torch_library::stats s{};
        if (lib_.stats_of(device_, &s) != 0) s = {};
        return s;
    }
    /// Before operation op_: PyTorch's empty_cache where the trace has it.
    void step() noexcept {
        while (next_ < releases_.size() && releases_[next_] <= op_) {
            static_cast<void>(lib_.empty_cache());
            ++next_;
        }
        ++op_;
    }

    /// What PyTorch keeps of a block to free it (its allocation's size and stream).
    struct block {
        ssize_t size;
        void* stream;
    };

    torch_library& lib_;
    int device_;
    std::unordered_map<void*, block> metadata_; ///< the live blocks, as PyTorch's allocation_metadata_
    std::vector<void*> streams_;         ///< the trace's streams as the library takes them ([0]: NULL)
    std::vector<std::size_t> releases_;  ///< sorted op indices
    std::size_t next_ = 0;               ///< releases_[0, next_) are done
    std::size_t op_ = 0;                 ///< operations begun
    std::string failure_;
};

/// The host library's streams: a custody host stream's state (custody_torch_allocator.h).
struct host_stream_arg {
    static void* of(const host::platform::stream_view& s) { return s.state(); }
    static void synchronize(void* s) { host::platform::synchronize(host::platform::stream_view(static_cast<host::detail::stream_state*>(s))); }
};

#if defined(CUSTODY_REPLAY_CUDA)
/// The CUDA library's streams: cudaStream_t.
struct cuda_stream_arg {
    static void* of(const cuda::platform::stream_view& s) { return static_cast<void*>(s.get()); }
    static void synchronize(void* s) { cuda::platform::synchronize(cuda::platform::stream_view(static_cast<cudaStream_t>(s))); }
};
#endif

/// The factory of the route's drivers over the loaded library `lib`, for `Platform`'s streams.
template <class Platform, class StreamArg>
driver_factory torch_library_drivers(torch_library& lib, bool empty_cache) {
    return [&lib, empty_cache](const device_program& p, stream_pool& streams) {
        using A = torch_library_adaptor<StreamArg>;
        const int device = lib.host() ? host_device_of(p.device) : p.device;
        const auto& views = streams.views<Platform>(device);
        std::vector<void*> args{nullptr}; // PyTorch's default stream
        for (std::size_t i = 1; i < views.size(); ++i) args.push_back(StreamArg::of(views[i]));
        std::vector<std::size_t> releases = empty_cache ? segment_releases(p) : std::vector<std::size_t>{};
        return make_driver<A>([&lib, device, args, releases] { return std::make_unique<A>(lib, device, args, releases); });
    };
}

/// Checks `spec` and returns the factory of the route's drivers. Loads the library here (once per
/// file), so that a bad path fails before the trace is read, and configures it: max_bytes (default,
/// for the host build: 80 GiB, a virtual device as large as custody-replay's default capacity; the
/// CUDA build: none, the device's own), chunked. Throws spec_error.
[[nodiscard]] inline driver_factory plan_torch_library(allocator_spec spec) {
    std::string path;
    if (const std::string* given = spec.take("path")) {
        path = *given;
    } else if (const char* env = std::getenv("CUSTODY_LIBRARY"); env != nullptr && *env != '\0') { // NOLINT(concurrency-mt-unsafe)
        path = env;
    } else {
        path = CUSTODY_REPLAY_TORCH_LIBRARY;
    }
    if (path.empty()) spec.fail("no library: give path=FILE or set CUSTODY_LIBRARY");
    std::uint64_t max_bytes = 0;
    spec.take_size("max_bytes", max_bytes);
    std::uint64_t chunked = 0;
    spec.take_count("chunked", chunked);
    if (chunked > 1) spec.fail("option chunked must be 0 or 1");
    const bool empty_cache = spec.take_choice("empty_cache", {"trace", "never"}) != 1;
    spec.check_all_used(torch_library_info.options);

    const std::string options = "max_bytes=" + std::to_string(max_bytes) + ",chunked=" + std::to_string(chunked);
    torch_library& lib = torch_library::load(path, options, spec);
    if (lib.options_applied.empty()) {
        const std::uint64_t cap = max_bytes != 0 ? max_bytes : lib.host() ? std::uint64_t{80} << 30 : 0;
        if ((cap != 0 && lib.configure("max_bytes", cap) != 0) || lib.configure("chunked", chunked) != 0) {
            spec.fail(std::string("the library refused its options: ") + lib.last_error());
        }
        lib.options_applied = options;
    }
    if (lib.host()) return torch_library_drivers<host::platform, host_stream_arg>(lib, empty_cache);
#if defined(CUSTODY_REPLAY_CUDA)
    if (!cuda_device_present()) spec.fail(path + " is the CUDA build of the library, and no CUDA device is present");
    return torch_library_drivers<cuda::platform, cuda_stream_arg>(lib, empty_cache);
#else
    spec.fail(path + " is the CUDA build of the library: it needs a custody-replay built with the CUDA Toolkit");
#endif
}

/// plan(), with the route through the library beside the catalog's allocators.
[[nodiscard]] inline driver_factory plan_any(allocator_spec spec) {
    if (spec.name() == torch_library_info.name) return plan_torch_library(std::move(spec));
    return plan(std::move(spec));
}

} // namespace custody::replay
