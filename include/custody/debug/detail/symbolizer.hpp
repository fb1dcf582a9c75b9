/// @file
/// Turns code addresses into source frames (function, file, line, inlined calls expanded) with
/// elfutils' libdw, from a module's file and an offset in it: the same code symbolizes this
/// process's call stacks when a report is made and, in custody-merge, stacks recorded elsewhere.
///
/// libdw is optional and explicit: define CUSTODY_WITH_LIBDW in every translation unit of the
/// program and link `-ldw -lelf` (pkg-config `libdw`, Debian/Ubuntu package libdw-dev); Meson's
/// `custody_symbolize_dep` and pkg-config's `custody-symbolize` do both. Without it every frame
/// reads "unsymbolized [MODULE+0xOFFSET]" (see frame_text.hpp), which custody-merge can symbolize
/// later.
#pragma once

#include <custody/core/detail/mutex.hpp>
#include <custody/debug/detail/frame_text.hpp>

#include <cxxabi.h>
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(CUSTODY_WITH_LIBDW)
#include <custody/debug/detail/dwarf_unit_index.hpp>

#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#endif

#include <array>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace custody::debug::detail {

/// `name` demangled when it is a C++ symbol, otherwise unchanged.
[[nodiscard]] inline std::string demangle(const char* name) {
    if (name == nullptr) return {};
    int status = -1;
    char* out = abi::__cxa_demangle(name, nullptr, nullptr, &status);
    std::string s = status == 0 && out != nullptr ? std::string(out) : std::string(name);
    std::free(out); // NOLINT: __cxa_demangle allocates with malloc
    return s;
}

/// The file this process runs (/proc/self/exe, read once), or "" when it cannot be read.
[[nodiscard]] inline const std::string& executable_path() {
    static const std::string path = [] {
        std::array<char, 4096> buffer{};
        const ssize_t n = ::readlink("/proc/self/exe", buffer.data(), buffer.size() - 1);
        return n > 0 ? std::string(buffer.data(), static_cast<std::size_t>(n)) : std::string();
    }();
    return path;
}

/// Where `address` lies in this process: the module whose loaded segment holds it and the address
/// less the module's load bias (the address in its file). The symbol is not looked up (see
/// name_symbol). Allocates; takes the dynamic loader's lock for a walk over the loaded modules.
[[nodiscard]] inline code_location locate(const void* address) {
    struct search {
        std::uintptr_t address;
        code_location* at;
    };
    code_location at;
    at.address = reinterpret_cast<std::uintptr_t>(address);
    at.offset = at.address;
    search s{at.address, &at};
    ::dl_iterate_phdr(
        [](dl_phdr_info* info, std::size_t, void* data) -> int {
            auto& s = *static_cast<search*>(data);
            for (ElfW(Half) i = 0; i < info->dlpi_phnum; ++i) {
                const ElfW(Phdr)& segment = info->dlpi_phdr[i];
                const std::uintptr_t start = info->dlpi_addr + segment.p_vaddr;
                if (segment.p_type != PT_LOAD || s.address < start || s.address - start >= segment.p_memsz) continue;
                s.at->offset = s.address - info->dlpi_addr;
                // The main program's entry has no name.
                s.at->module = info->dlpi_name != nullptr && info->dlpi_name[0] != '\0' ? std::string(info->dlpi_name)
                                                                                      : executable_path();
                return 1;
            }
            return 0;
        },
        &s);
    return at;
}

/// Fills `at`'s symbol with the nearest exported symbol (dladdr), for a frame that stays
/// unsymbolized; does nothing for a location read from text or without such a symbol.
inline void name_symbol(code_location& at) {
    Dl_info info{};
    if (at.address == 0 || !at.symbol.empty()) return;
    if (::dladdr(reinterpret_cast<const void*>(at.address), &info) == 0) return;
    if (info.dli_sname == nullptr || info.dli_saddr == nullptr) return;
    at.symbol = short_function_name(demangle(info.dli_sname));
    at.symbol_offset = at.address - reinterpret_cast<std::uintptr_t>(info.dli_saddr);
}

/// Symbolizes (module, offset) pairs, opening each module once and remembering each answer.
///
/// Thread safety: none; process_symbolizer() is the shared one, behind a mutex.
/// Ownership: holds one libdw session per module it opened (the file mapped, not copied) and an
/// index per compilation unit it looked in, until destroyed. Complexity: the first address in a
/// compilation unit reads its entries once (dwarf_unit_index); later addresses cost a binary
/// search and a walk down the inlined calls there; an address asked before, a map lookup. Module paths may come from untrusted reports: only regular
/// files are opened, and a file that is not ELF just gives no frames.
class symbolizer {
public:
    /// True when built with libdw; without it frames_at() always answers with no frame.
#if defined(CUSTODY_WITH_LIBDW)
    static constexpr bool available = true;
#else
    static constexpr bool available = false;
#endif

    /// `search_dirs`: where to look for a module by its file name when the recorded path is not
    /// a file on this machine (reports from another machine, binaries copied elsewhere).
    explicit symbolizer(std::vector<std::string> search_dirs = {}) : search_dirs_(std::move(search_dirs)) {}
    symbolizer(const symbolizer&) = delete;
    symbolizer& operator=(const symbolizer&) = delete;
    ~symbolizer() = default;

    /// The source frames at the return address `offset` in `module` (the call just before it is
    /// looked up), innermost first; empty when the module cannot be read or says nothing there.
    /// The reference stays valid as long as the symbolizer.
    const std::vector<source_frame>& frames_at(const std::string& module, std::uintptr_t offset) {
        const auto key = std::make_pair(module, offset);
        const auto known = answers_.find(key);
        if (known != answers_.end()) return known->second;
        return answers_.emplace(key, lookup(module, offset)).first->second;
    }

    /// Forgets the answers remembered so far (the modules stay open): memory back, or a measure
    /// of the lookup itself.
    void forget_answers() noexcept { answers_.clear(); }

    /// The regular file `module` names, else the first search directory's file of that name;
    /// "" when there is none.
    [[nodiscard]] std::string find_file(const std::string& module) const {
        const auto regular = [](const std::string& p) {
            struct stat st {};
            return !p.empty() && ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
        };
        if (regular(module)) return module;
        const std::string name = std::filesystem::path(module).filename().string();
        if (name.empty()) return {};
        for (const auto& dir : search_dirs_) {
            const std::string candidate = (std::filesystem::path(dir) / name).string();
            if (regular(candidate)) return candidate;
        }
        return {};
    }

private:
    std::vector<std::string> search_dirs_;
    std::map<std::pair<std::string, std::uintptr_t>, std::vector<source_frame>> answers_;

#if defined(CUSTODY_WITH_LIBDW)
    struct session_end {
        void operator()(Dwfl* d) const noexcept { dwfl_end(d); }
    };
    /// One module's libdw session. Invariant: module != nullptr implies dwfl != nullptr.
    struct session {
        std::unique_ptr<Dwfl, session_end> dwfl;
        Dwfl_Module* module = nullptr;
    };
    std::map<std::string, session> sessions_; ///< by module path as asked; failures kept (tried once)

    /// Modules opened at most (each holds a file open): a report naming more is untrusted input.
    static constexpr std::size_t max_modules = 1024;

    Dwfl_Module* open(const std::string& module) {
        const auto known = sessions_.find(module);
        if (known != sessions_.end()) return known->second.module;
        if (sessions_.size() >= max_modules) return nullptr;
        session& s = sessions_[module];
        const std::string path = find_file(module);
        if (path.empty()) return nullptr;
        // Separate debug files by build id in the local debug directories only: never the network.
        static const Dwfl_Callbacks callbacks = {nullptr, dwfl_build_id_find_debuginfo, dwfl_offline_section_address,
                                                 nullptr};
        s.dwfl.reset(dwfl_begin(&callbacks));
        if (!s.dwfl) return nullptr;
        dwfl_report_begin(s.dwfl.get());
        // Placed at 0, so Dwfl addresses are the file's own addresses: the offsets.
        s.module = dwfl_report_elf(s.dwfl.get(), module.c_str(), path.c_str(), -1, 0, false);
        if (dwfl_report_end(s.dwfl.get(), nullptr, nullptr) != 0) s.module = nullptr;
        return s.module;
    }

    /// `file` normalized, and made absolute when it is relative to an absolute compilation
    /// directory (a build that mapped its directories away keeps its relative names); "" for none.
    static std::string source_path(Dwarf_Die* cu, const char* file) {
        if (file == nullptr || *file == '\0') return {};
        std::filesystem::path p(file);
        if (p.is_relative() && cu != nullptr) {
            Dwarf_Attribute a;
            const char* dir = dwarf_formstring(dwarf_attr(cu, DW_AT_comp_dir, &a));
            if (dir != nullptr && dir[0] == '/') p = std::filesystem::path(dir) / p;
        }
        return p.lexically_normal().string();
    }

    /// A function's name from its DWARF entry: the linkage name demangled, else the name under
    /// the scopes around its declaration (found through abstract origins and specifications).
    static std::string function_name(Dwarf_Die* die, const dwarf_unit_index& unit) {
        Dwarf_Attribute a;
        if (dwarf_attr_integrate(die, DW_AT_linkage_name, &a) != nullptr ||
            dwarf_attr_integrate(die, DW_AT_MIPS_linkage_name, &a) != nullptr) {
            if (const char* linkage = dwarf_formstring(&a)) return short_function_name(demangle(linkage));
        }
        Dwarf_Die named = *die;
        for (int hop = 0; dwarf_attr(&named, DW_AT_name, &a) == nullptr; ++hop) {
            Dwarf_Die next;
            const bool linked = dwarf_attr(&named, DW_AT_abstract_origin, &a) != nullptr ||
                                dwarf_attr(&named, DW_AT_specification, &a) != nullptr;
            if (hop == 8 || !linked || dwarf_formref_die(&a, &next) == nullptr) return {};
            named = next;
        }
        const char* name = dwarf_diename(&named);
        if (name == nullptr) return {};
        const std::string* scope = unit.scope_of(dwarf_dieoffset(&named));
        return short_function_name(scope != nullptr ? *scope + name : std::string(name));
    }

    /// Where an inlined call was made: DW_AT_call_file / DW_AT_call_line of `inlined`.
    static std::pair<std::string, unsigned> call_site(Dwarf_Die* cu, Dwarf_Die* inlined) {
        Dwarf_Attribute a;
        Dwarf_Word file = 0;
        Dwarf_Word line = 0;
        std::string name;
        Dwarf_Files* files = nullptr;
        std::size_t count = 0;
        if (dwarf_formudata(dwarf_attr(inlined, DW_AT_call_file, &a), &file) == 0 &&
            dwarf_getsrcfiles(cu, &files, &count) == 0 && file < count) {
            name = source_path(cu, dwarf_filesrc(files, file, nullptr, nullptr));
        }
        if (dwarf_formudata(dwarf_attr(inlined, DW_AT_call_line, &a), &line) != 0) line = 0;
        return {name, static_cast<unsigned>(line)};
    }

    /// Appends to `chain` the inlined calls inside `scope` whose code holds `pc`, outermost first
    /// (through lexical blocks, which are not calls).
    static void inlined_calls(Dwarf_Die scope, Dwarf_Addr pc, std::vector<Dwarf_Die>& chain) {
        for (int depth = 0; depth < 256; ++depth) { // a bound for hostile input; real nesting is shallow
            Dwarf_Die child;
            if (dwarf_child(&scope, &child) != 0) return;
            bool inside = false;
            for (;;) {
                const int tag = dwarf_tag(&child);
                if ((tag == DW_TAG_inlined_subroutine || tag == DW_TAG_lexical_block || tag == DW_TAG_try_block ||
                     tag == DW_TAG_catch_block) &&
                    dwarf_haspc(&child, pc) == 1) {
                    if (tag == DW_TAG_inlined_subroutine) chain.push_back(child);
                    inside = true;
                    break;
                }
                Dwarf_Die next;
                if (dwarf_siblingof(&child, &next) != 0) break;
                child = next;
            }
            if (!inside) return;
            scope = child;
        }
    }

    /// The index of `cu` in `module`, built on first use.
    const dwarf_unit_index& unit(Dwfl_Module* module, Dwarf_Die* cu) {
        const auto key = std::make_pair(module, dwarf_dieoffset(cu));
        const auto known = units_.find(key);
        if (known != units_.end()) return known->second;
        return units_.try_emplace(key, cu).first->second;
    }
    std::map<std::pair<Dwfl_Module*, Dwarf_Off>, dwarf_unit_index> units_; ///< by module and unit offset

    std::vector<source_frame> lookup(const std::string& module, std::uintptr_t offset) {
        std::vector<source_frame> out;
        Dwfl_Module* m = open(module);
        if (m == nullptr || offset == 0) return out;
        const Dwarf_Addr pc = offset - 1; // a return address: the call is the instruction before it
        Dwarf_Addr bias = 0;
        Dwarf_Die* cu = dwfl_module_addrdie(m, pc, &bias);
        std::string file;
        unsigned line = 0;
        if (Dwfl_Line* l = dwfl_module_getsrc(m, pc)) {
            int n = 0;
            file = source_path(cu, dwfl_lineinfo(l, nullptr, &n, nullptr, nullptr, nullptr));
            line = n > 0 ? static_cast<unsigned>(n) : 0;
        }
        if (cu != nullptr) {
            // The function at pc, then the calls inlined into it, outermost first.
            const dwarf_unit_index& index = unit(m, cu);
            if (const Dwarf_Die* function = index.function_at(pc - bias)) {
                std::vector<Dwarf_Die> chain{*function};
                inlined_calls(*function, pc - bias, chain);
                // Innermost first: each at its own line, its caller at the line of the call.
                for (std::size_t i = chain.size(); i-- > 0;) {
                    out.push_back(source_frame{function_name(&chain[i], index), file, line, i > 0});
                    if (i > 0) std::tie(file, line) = call_site(cu, &chain[i]);
                }
            }
        }
        if (out.empty()) { // no debug information: the symbol table's name, with the line if any
            GElf_Off from_symbol = 0;
            GElf_Sym sym;
            if (const char* name = dwfl_module_addrinfo(m, pc, &from_symbol, &sym, nullptr, nullptr, nullptr)) {
                out.push_back(source_frame{short_function_name(demangle(name)), file, line, false});
            }
        }
        return out;
    }
#else
    std::vector<source_frame> lookup(const std::string&, std::uintptr_t) { return {}; }
#endif
};

/// The process-wide symbolizer that every tracker's reports use, and its lock. Made on first use
/// and never destroyed, so a report made while static objects are destroyed (a leak report at
/// exit) still symbolizes; the modules it opened stay mapped until the process ends.
struct shared_symbolizer {
    custody::detail::mutex mutex;
    symbolizer instance; ///< guarded by mutex
};

[[nodiscard]] inline shared_symbolizer& process_symbolizer() {
    static auto* const shared = new shared_symbolizer(); // NOLINT: never destroyed, on purpose
    return *shared;
}

/// One line of a stack being symbolized, with its function's name when known.
struct named_frame {
    std::string function; ///< empty when unknown
    std::string text;     ///< frame_text or unsymbolized_text
};

/// Whether `f` is custody's own or the C++ runtime's (runtime_frame), by its function's name, or
/// the name its text carries, and by its module.
[[nodiscard]] inline bool runtime_frame(const named_frame& f) {
    const std::string_view function = f.function.empty() ? frame_function(f.text) : std::string_view(f.function);
    const auto at = frame_location(f.text);
    return runtime_frame(function, at ? std::string_view(at->module) : std::string_view{});
}

/// The lines of `frames` from the first one that is neither custody's own nor the C++ runtime's:
/// the tracker's frames on top of a stack (inlined or not), and the standard library's between
/// them and the application (std::construct_at, an allocator's allocate, vector's growth, in
/// alloc_traits.h and vector.tcc), are left out, so a report starts where the application asked
/// for memory; every frame below that one is kept, the runtime's included. A stack of such frames
/// only is kept whole.
[[nodiscard]] inline std::vector<std::string> application_first(const std::vector<named_frame>& frames) {
    std::size_t first = 0;
    while (first < frames.size() && runtime_frame(frames[first])) ++first;
    if (first == frames.size()) first = 0;
    std::vector<std::string> lines;
    lines.reserve(frames.size() - first);
    for (std::size_t i = first; i < frames.size(); ++i) lines.push_back(frames[i].text);
    return lines;
}

/// Appends the source frames of `at` to `out` (one per inlined call), or one unsymbolized line.
inline void append_frames(symbolizer& s, const code_location& at, std::vector<named_frame>& out) {
    const std::vector<source_frame>* frames = nullptr;
    if (!at.module.empty()) frames = &s.frames_at(at.module, at.offset);
    if (frames == nullptr || frames->empty()) {
        code_location named = at;
        name_symbol(named);
        out.push_back(named_frame{named.symbol, unsymbolized_text(named)});
        return;
    }
    for (const source_frame& f : *frames) out.push_back(named_frame{f.function, frame_text(f, at)});
}

/// The report lines of a captured stack (return addresses located in this process), innermost
/// first, application first (see application_first).
[[nodiscard]] inline std::vector<std::string> symbolize_stack(symbolizer& s, const std::vector<code_location>& where) {
    std::vector<named_frame> frames;
    frames.reserve(where.size());
    for (const code_location& at : where) append_frames(s, at, frames);
    return application_first(frames);
}

/// A report's stack with its unsymbolized lines symbolized where `s` can read their modules
/// (offline, in custody-merge), the functions other lines name shortened as this version does,
/// and starting at the application (application_first). Returns how many lines are still
/// unsymbolized.
inline std::size_t symbolize_lines(symbolizer& s, std::vector<std::string>& stack) {
    std::vector<named_frame> frames;
    frames.reserve(stack.size());
    for (std::string& line : stack) {
        const auto at = is_unsymbolized(line) ? frame_location(line) : std::nullopt;
        if (at) {
            append_frames(s, *at, frames);
            if (is_unsymbolized(frames.back().text)) frames.back().text = std::move(line); // as it was
        } else {
            frames.push_back(named_frame{{}, with_short_function(std::move(line))}); // one naming rule
        }
    }
    stack = application_first(frames);
    std::size_t left = 0;
    for (const auto& line : stack) left += is_unsymbolized(line) ? 1 : 0;
    return left;
}

} // namespace custody::debug::detail
