// A small NVTX tool for the tests: loaded by NVTX through NVTX_INJECTION64_PATH, it records every
// call of NVTX's memory API (heaps, regions, names) as a tool such as compute-sanitizer receives it,
// checks each against the rules those tools state (a region lies in a heap, is registered once and
// unregistered once, names are printable ASCII of 1 to 49 characters, ...), and lets the test that
// links it read what it holds (recording.hpp).
//
// Entry points, as NVTX looks them up in the library: InitializeInjectionNvtx2 (the core: the tool
// fills the domain functions through the export table NVTX hands it) and
// InitializeInjectionNvtxExtension (each extension module: the tool fills the module's slots,
// indexed by the NVTX3EXT_CBID_* numbers).
#define NVTX_NO_IMPL // declarations and types only: a tool implements the functions
#include <nvtx3/nvToolsExtMem.h>

#include "recording.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct heap_entry {
    std::size_t size;
    std::string name;
};
struct region_entry {
    std::size_t size;
    std::uintptr_t heap;
    std::string name;
};

/// Everything the tool was told, under one lock (the application calls from any thread).
struct recorder {
    std::mutex mutex;
    std::vector<std::string> domains;
    std::map<std::uintptr_t, heap_entry> heaps;       // base (also the handle) -> heap
    std::map<std::uintptr_t, region_entry> regions;   // address -> region
    std::map<std::uintptr_t, std::string> named;      // names given to memory outside every heap
    std::vector<custody_nvtx_record> dropped;         // regions still in a heap when it went
    std::vector<std::string> dropped_names;
    std::vector<std::string> violations;
    std::uint64_t calls = 0;

    void violation(std::string what) { violations.push_back(std::move(what)); }

    [[nodiscard]] std::map<std::uintptr_t, heap_entry>::iterator heap_holding(std::uintptr_t a) {
        auto it = heaps.upper_bound(a);
        if (it == heaps.begin()) return heaps.end();
        --it;
        return a < it->first + it->second.size ? it : heaps.end();
    }
};

recorder& state() {
    static recorder r;
    return r;
}

std::string hex(std::uintptr_t a) {
    char text[32];
    std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(a));
    return text;
}

/// A name as compute-sanitizer takes it: printable ASCII, 1 to 49 characters.
bool valid_name(const char* s) {
    if (s == nullptr) return false;
    const std::size_t n = std::strlen(s);
    if (n == 0 || n > 49) return false;
    for (std::size_t i = 0; i < n; ++i) {
        if (s[i] < 0x20 || s[i] >= 0x7f) return false;
    }
    return true;
}

// ---- the core: domains ----------------------------------------------------------------------------

nvtxDomainHandle_t NVTX_API domain_create_a(const char* name) {
    recorder& r = state();
    std::lock_guard lock(r.mutex);
    ++r.calls;
    r.domains.emplace_back(name != nullptr ? name : "");
    return reinterpret_cast<nvtxDomainHandle_t>(static_cast<std::uintptr_t>(r.domains.size())); // 1, 2, ...
}

void NVTX_API domain_destroy(nvtxDomainHandle_t) {}

// ---- the memory extension ---------------------------------------------------------------------------

nvtxMemHeapHandle_t NVTX_API heap_register(nvtxDomainHandle_t, const nvtxMemHeapDesc_t* desc) {
    recorder& r = state();
    std::lock_guard lock(r.mutex);
    ++r.calls;
    if (desc == nullptr || desc->extCompatID != NVTX_EXT_COMPATID_MEM || desc->structSize != sizeof(*desc) ||
        desc->usage != NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR || desc->type != NVTX_MEM_TYPE_VIRTUAL_ADDRESS ||
        desc->typeSpecificDescSize != sizeof(nvtxMemVirtualRangeDesc_t) || desc->typeSpecificDesc == nullptr) {
        r.violation("heap register: a descriptor compute-sanitizer does not take");
        return nullptr;
    }
    const auto* range = static_cast<const nvtxMemVirtualRangeDesc_t*>(desc->typeSpecificDesc);
    const auto base = reinterpret_cast<std::uintptr_t>(range->ptr);
    if (range->size == 0) r.violation("heap register: empty heap at " + hex(base));
    auto next = r.heaps.lower_bound(base);
    if ((next != r.heaps.end() && next->first < base + range->size) || r.heap_holding(base) != r.heaps.end()) {
        r.violation("heap register: " + hex(base) + " overlaps a heap");
        return nullptr;
    }
    std::string name;
    if (desc->messageType == NVTX_MESSAGE_TYPE_ASCII && desc->message.ascii != nullptr) name = desc->message.ascii;
    r.heaps.emplace(base, heap_entry{range->size, std::move(name)});
    return reinterpret_cast<nvtxMemHeapHandle_t>(base); // a virtual-address heap's handle is its address
}

/// Drops the regions of the heap at `base` (mutex held), keeping them as the heap's leaks.
void drop_regions(recorder& r, std::uintptr_t base, std::size_t size) {
    auto first = r.regions.lower_bound(base);
    auto last = r.regions.lower_bound(base + size);
    for (auto it = first; it != last; ++it) {
        r.dropped.push_back(custody_nvtx_record{it->first, it->second.size, base, nullptr});
        r.dropped_names.push_back(it->second.name);
    }
    r.regions.erase(first, last);
}

/// The heap `handle` names (mutex held); a violation of `call` and end() when none.
std::map<std::uintptr_t, heap_entry>::iterator known_heap(recorder& r, nvtxMemHeapHandle_t handle, const char* call) {
    const auto base = reinterpret_cast<std::uintptr_t>(handle);
    auto it = r.heaps.find(base);
    if (it == r.heaps.end()) r.violation(std::string(call) + ": " + hex(base) + " is no heap");
    return it;
}

void NVTX_API heap_unregister(nvtxDomainHandle_t, nvtxMemHeapHandle_t heap) {
    recorder& r = state();
    std::lock_guard lock(r.mutex);
    ++r.calls;
    auto it = known_heap(r, heap, "heap unregister");
    if (it == r.heaps.end()) return;
    drop_regions(r, it->first, it->second.size);
    r.heaps.erase(it);
}

void NVTX_API heap_reset(nvtxDomainHandle_t, nvtxMemHeapHandle_t heap) {
    recorder& r = state();
    std::lock_guard lock(r.mutex);
    ++r.calls;
    auto it = known_heap(r, heap, "heap reset");
    if (it == r.heaps.end()) return;
    r.regions.erase(r.regions.lower_bound(it->first), r.regions.lower_bound(it->first + it->second.size));
}

void NVTX_API regions_register(nvtxDomainHandle_t, const nvtxMemRegionsRegisterBatch_t* batch) {
    recorder& r = state();
    std::lock_guard lock(r.mutex);
    ++r.calls;
    if (batch == nullptr || batch->extCompatID != NVTX_EXT_COMPATID_MEM || batch->structSize != sizeof(*batch) ||
        batch->regionType != NVTX_MEM_TYPE_VIRTUAL_ADDRESS ||
        batch->regionDescElementSize != sizeof(nvtxMemVirtualRangeDesc_t)) {
        r.violation("regions register: a batch compute-sanitizer does not take");
        return;
    }
    const auto heap = reinterpret_cast<std::uintptr_t>(batch->heap);
    auto h = r.heaps.find(heap);
    const auto* ranges = static_cast<const nvtxMemVirtualRangeDesc_t*>(batch->regionDescElements);
    for (std::size_t i = 0; i < batch->regionCount; ++i) {
        const auto a = reinterpret_cast<std::uintptr_t>(ranges[i].ptr);
        const std::size_t n = ranges[i].size;
        if (h == r.heaps.end() || a < heap || a + n > heap + h->second.size || n == 0) {
            r.violation("regions register: " + hex(a) + " (" + std::to_string(n) + " bytes) is not within its heap " + hex(heap));
            continue;
        }
        auto next = r.regions.lower_bound(a);
        const bool overlaps_next = next != r.regions.end() && next->first < a + n;
        const bool overlaps_prev = next != r.regions.begin() && std::prev(next)->first + std::prev(next)->second.size > a;
        if (overlaps_next || overlaps_prev) {
            r.violation("regions register: " + hex(a) + " overlaps a live region");
            continue;
        }
        r.regions.emplace(a, region_entry{n, heap, {}});
    }
}

void NVTX_API regions_unregister(nvtxDomainHandle_t, const nvtxMemRegionsUnregisterBatch_t* batch) {
    recorder& r = state();
    std::lock_guard lock(r.mutex);
    ++r.calls;
    if (batch == nullptr || batch->extCompatID != NVTX_EXT_COMPATID_MEM || batch->structSize != sizeof(*batch) ||
        batch->refType != NVTX_MEM_REGION_REF_TYPE_POINTER || batch->refElementSize != sizeof(nvtxMemRegionRef_t)) {
        r.violation("regions unregister: a batch compute-sanitizer does not take");
        return;
    }
    for (std::size_t i = 0; i < batch->refCount; ++i) {
        const auto a = reinterpret_cast<std::uintptr_t>(batch->refElements[i].pointer);
        if (r.regions.erase(a) == 0) r.violation("regions unregister: " + hex(a) + " is no live region");
    }
}

void NVTX_API regions_resize(nvtxDomainHandle_t, const nvtxMemRegionsResizeBatch_t*) {
    recorder& r = state();
    std::lock_guard lock(r.mutex);
    ++r.calls;
    r.violation("regions resize: custody never resizes a block");
}

void NVTX_API regions_name(nvtxDomainHandle_t, const nvtxMemRegionsNameBatch_t* batch) {
    recorder& r = state();
    std::lock_guard lock(r.mutex);
    ++r.calls;
    if (batch == nullptr || batch->extCompatID != NVTX_EXT_COMPATID_MEM || batch->structSize != sizeof(*batch) ||
        batch->regionElementSize != sizeof(nvtxMemRegionNameDesc_t)) {
        r.violation("regions name: a batch compute-sanitizer does not take");
        return;
    }
    for (std::size_t i = 0; i < batch->regionCount; ++i) {
        const nvtxMemRegionNameDesc_t& e = batch->regionElements[i];
        if (e.regionRefType != NVTX_MEM_REGION_REF_TYPE_POINTER || e.nameType != NVTX_MESSAGE_TYPE_ASCII) {
            r.violation("regions name: compute-sanitizer takes pointers and ASCII names only");
            continue;
        }
        const auto a = reinterpret_cast<std::uintptr_t>(e.region.pointer);
        if (!valid_name(e.name.ascii)) {
            r.violation("regions name: '" + std::string(e.name.ascii != nullptr ? e.name.ascii : "") +
                        "' is not 1 to 49 printable ASCII characters");
            continue;
        }
        if (auto it = r.regions.find(a); it != r.regions.end()) {
            it->second.name = e.name.ascii;
        } else if (auto h = r.heaps.find(a); h != r.heaps.end()) {
            h->second.name = e.name.ascii; // a heap that is one region: the region at its base
        } else if (r.heap_holding(a) == r.heaps.end()) {
            r.named[a] = e.name.ascii; // an allocation of its own
        } else {
            r.violation("regions name: " + hex(a) + " lies in a heap but starts no region");
        }
    }
}

} // namespace

extern "C" {

// ---- the entry points NVTX looks up ------------------------------------------------------------------

__attribute__((visibility("default"))) int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_export_table) {
    const auto* callbacks = static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS));
    if (callbacks == nullptr) return 0;
    NvtxFunctionTable table = nullptr;
    unsigned int size = 0;
    if (callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) == 0 || table == nullptr) return 0;
    if (size > NVTX_CBID_CORE2_DomainCreateA) {
        *table[NVTX_CBID_CORE2_DomainCreateA] = reinterpret_cast<NvtxFunctionPointer>(&domain_create_a);
    }
    if (size > NVTX_CBID_CORE2_DomainDestroy) {
        *table[NVTX_CBID_CORE2_DomainDestroy] = reinterpret_cast<NvtxFunctionPointer>(&domain_destroy);
    }
    return 1;
}

__attribute__((visibility("default"))) int InitializeInjectionNvtxExtension(nvtxExtModuleInfo_t* info) {
    if (info == nullptr || info->moduleId != NVTX_EXT_MODULEID_MEM) return 1; // other modules: no-ops
    for (std::size_t s = 0; s < info->segmentsCount; ++s) {
        nvtxExtModuleSegment_t& segment = info->segments[s];
        const auto set = [&](std::size_t id, auto* fn) {
            if (id < segment.slotCount) segment.functionSlots[id] = reinterpret_cast<intptr_t>(fn);
        };
        set(NVTX3EXT_CBID_nvtxMemHeapRegister, &heap_register);
        set(NVTX3EXT_CBID_nvtxMemHeapUnregister, &heap_unregister);
        set(NVTX3EXT_CBID_nvtxMemHeapReset, &heap_reset);
        set(NVTX3EXT_CBID_nvtxMemRegionsRegister, &regions_register);
        set(NVTX3EXT_CBID_nvtxMemRegionsResize, &regions_resize);
        set(NVTX3EXT_CBID_nvtxMemRegionsUnregister, &regions_unregister);
        set(NVTX3EXT_CBID_nvtxMemRegionsName, &regions_name);
    }
    return 1;
}

// ---- what the tests read -------------------------------------------------------------------------------

__attribute__((visibility("default"))) int custody_nvtx_recorder_loaded(void) { return 1; }

__attribute__((visibility("default"))) void custody_nvtx_recorder_read(custody_nvtx_visitor visit, void* context) {
    recorder& r = state();
    std::lock_guard lock(r.mutex);
    for (const std::string& d : r.domains) visit(context, custody_nvtx_domain, {0, 0, 0, d.c_str()});
    for (const auto& [base, h] : r.heaps) visit(context, custody_nvtx_heap, {base, h.size, base, h.name.c_str()});
    for (const auto& [a, g] : r.regions) visit(context, custody_nvtx_region, {a, g.size, g.heap, g.name.c_str()});
    for (const auto& [a, n] : r.named) visit(context, custody_nvtx_named, {a, 0, 0, n.c_str()});
    for (std::size_t i = 0; i < r.dropped.size(); ++i) {
        custody_nvtx_record d = r.dropped[i];
        d.name = r.dropped_names[i].c_str();
        visit(context, custody_nvtx_dropped, d);
    }
    for (const std::string& v : r.violations) visit(context, custody_nvtx_violation, {0, 0, 0, v.c_str()});
}

__attribute__((visibility("default"))) void custody_nvtx_recorder_forget(void) {
    recorder& r = state();
    std::lock_guard lock(r.mutex);
    r.named.clear();
    r.dropped.clear();
    r.dropped_names.clear();
    r.violations.clear();
}

} // extern "C"
