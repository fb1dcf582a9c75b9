// What the NVTX recording tool (recorder.cpp, a shared library loaded by NVTX through
// NVTX_INJECTION64_PATH) holds: its C interface, and a C++ snapshot read through the library the
// variable names, so that a suite checks what CUDA's tools were told when it is run with the tool
// (the nvtx suite runs the pool's model tests and the composition matrix so) and skips the check
// when it is not.
#pragma once

#include <stddef.h>
#include <stdint.h>

extern "C" {
enum custody_nvtx_kind {
    custody_nvtx_domain,    ///< a domain created (name)
    custody_nvtx_heap,      ///< a live heap (address, size, name)
    custody_nvtx_region,    ///< a live region (address, size, heap, name)
    custody_nvtx_named,     ///< a name given to memory outside every heap (address, name)
    custody_nvtx_dropped,   ///< a region still in its heap when the heap was unregistered (a leak)
    custody_nvtx_violation, ///< a call that broke the API's rules (name: what)
};
struct custody_nvtx_record {
    uintptr_t address;
    size_t size;
    uintptr_t heap;
    const char* name;
};
typedef void (*custody_nvtx_visitor)(void* context, enum custody_nvtx_kind kind, struct custody_nvtx_record record);

/// 1 (the tool is linked; NVTX loads it only when NVTX_INJECTION64_PATH names it).
int custody_nvtx_recorder_loaded(void);
/// Calls `visit` for every record, under the tool's lock (the strings live until it returns).
void custody_nvtx_recorder_read(custody_nvtx_visitor visit, void* context);
/// Forgets the names of other allocations, the dropped regions and the violations (heaps and
/// regions stay: they are live).
void custody_nvtx_recorder_forget(void);
}

#ifdef __cplusplus
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <dlfcn.h>

namespace custody_nvtx_test {

/// The tool's functions, from the library NVTX_INJECTION64_PATH names (the one NVTX loads: opening
/// it again returns the same library); null when the variable names none. Throws when it names a
/// library that is not the recording tool: a run meant to check what the tools were told must not
/// pass without checking.
struct recorder_functions {
    decltype(&custody_nvtx_recorder_read) read = nullptr;
    decltype(&custody_nvtx_recorder_forget) forget = nullptr;
};
inline const char* recorder_path() {
    const char* path = std::getenv("NVTX_INJECTION64_PATH");
    return path != nullptr && *path != '\0' ? path : nullptr;
}
inline const recorder_functions* recorder() {
    static recorder_functions found;
    if (found.read != nullptr) return &found;
    const char* path = recorder_path();
    if (path == nullptr) return nullptr;
    void* library = ::dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (library != nullptr) {
        found.forget = reinterpret_cast<decltype(found.forget)>(::dlsym(library, "custody_nvtx_recorder_forget"));
        found.read = reinterpret_cast<decltype(found.read)>(::dlsym(library, "custody_nvtx_recorder_read"));
    }
    if (found.read == nullptr || found.forget == nullptr) {
        found = {};
        throw std::runtime_error(std::string("NVTX_INJECTION64_PATH names ") + path +
                                 ", which is not the NVTX recording tool (tests/nvtx/recorder.cpp)");
    }
    return &found;
}

/// Whether this run has the recording tool loaded: what the checks below need.
inline bool recording_run() { return recorder_path() != nullptr; }

/// Forgets what custody_nvtx_recorder_forget forgets; nothing without the tool.
inline void forget() {
    if (const recorder_functions* f = recorder()) f->forget();
}

struct heap {
    std::size_t size;
    std::string name;
};
struct region {
    std::size_t size;
    std::uintptr_t heap;
    std::string name;
    friend bool operator==(const region&, const region&) = default;
};
struct dropped_region {
    std::uintptr_t address;
    std::size_t size;
    std::string name;
};

/// A copy of what the tool holds.
struct recording {
    std::vector<std::string> domains;
    std::map<std::uintptr_t, heap> heaps;
    std::map<std::uintptr_t, region> regions;
    std::map<std::uintptr_t, std::string> named;
    std::vector<dropped_region> dropped;
    std::vector<std::string> violations;

    /// The live regions' sizes by address.
    [[nodiscard]] std::map<std::uintptr_t, std::size_t> region_sizes() const {
        std::map<std::uintptr_t, std::size_t> m;
        for (const auto& [a, r] : regions) m.emplace(a, r.size);
        return m;
    }
    [[nodiscard]] std::size_t heap_bytes() const {
        std::size_t n = 0;
        for (const auto& [a, h] : heaps) n += h.size;
        return n;
    }
};

/// What the tool holds; empty without it.
inline recording read() {
    recording r;
    const recorder_functions* f = recorder();
    if (f == nullptr) return r;
    f->read(
        [](void* context, custody_nvtx_kind kind, custody_nvtx_record e) {
            auto& out = *static_cast<recording*>(context);
            const std::string name = e.name != nullptr ? e.name : "";
            switch (kind) {
            case custody_nvtx_domain: out.domains.push_back(name); break;
            case custody_nvtx_heap: out.heaps.emplace(e.address, heap{e.size, name}); break;
            case custody_nvtx_region: out.regions.emplace(e.address, region{e.size, e.heap, name}); break;
            case custody_nvtx_named: out.named.emplace(e.address, name); break;
            case custody_nvtx_dropped: out.dropped.push_back({e.address, e.size, name}); break;
            case custody_nvtx_violation: out.violations.push_back(name); break;
            }
        },
        &r);
    return r;
}

} // namespace custody_nvtx_test
#endif
