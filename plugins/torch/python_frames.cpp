// The library's stack extension in a Python process: each captured stack keeps the application's
// native frames (PyTorch's C++ among them), leaves out the library's own and the interpreter's
// plumbing (libffi, _ctypes, libpython), and puts the allocating thread's Python frames in their
// place, as PyTorch's _record_memory_history(stacks="python"/"all") keeps them. Python is reached
// through the symbols of the interpreter that loaded the library (dlsym), never linked: in a
// process without Python nothing is installed.
#include "python_frames.hpp"

#include <custody/debug/detail/call_stack.hpp>

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace custody_plugin {
namespace {

/// CPython's C API, found in the process (3.9 or later: PyFrame_GetBack and PyFrame_GetCode).
struct python_api {
    using object = void*;
    int (*gil_ensure)() = nullptr; // PyGILState_STATE is an int-sized enum
    void (*gil_release)(int) = nullptr;
    int (*is_initialized)() = nullptr;
    object (*current_frame)() = nullptr; // PyEval_GetFrame: borrowed
    object (*frame_back)(object) = nullptr; // new reference
    object (*frame_code)(object) = nullptr; // new reference
    int (*frame_line)(object) = nullptr;
    object (*get_attribute)(object, const char*) = nullptr; // new reference
    const char* (*utf8)(object) = nullptr;
    void (*incref)(object) = nullptr;
    void (*decref)(object) = nullptr;
    void (*clear_error)() = nullptr;

    template <class F>
    static bool find(F& f, const char* name) noexcept {
        f = reinterpret_cast<F>(::dlsym(RTLD_DEFAULT, name)); // NOLINT: a C function of the interpreter
        return f != nullptr;
    }
    bool load() noexcept {
        return find(gil_ensure, "PyGILState_Ensure") && find(gil_release, "PyGILState_Release") &&
               find(is_initialized, "Py_IsInitialized") && find(current_frame, "PyEval_GetFrame") &&
               find(frame_back, "PyFrame_GetBack") && find(frame_code, "PyFrame_GetCode") &&
               find(frame_line, "PyFrame_GetLineNumber") && find(get_attribute, "PyObject_GetAttrString") &&
               find(utf8, "PyUnicode_AsUTF8") && find(incref, "Py_IncRef") && find(decref, "Py_DecRef") &&
               find(clear_error, "PyErr_Clear");
    }
};

/// One Python frame as a report names it; `code` keeps its code object alive (a reference).
/// `custodys`: the code is the custody package's own (a file of a directory named custody that
/// holds _library.py), whose frames on top of a stack are left out as its C++ frames are.
struct python_frame {
    void* code = nullptr;
    int line = 0;
    std::string filename;
    std::string name;
    bool custodys = false;
};

[[nodiscard]] bool in_custody_package(const std::string& filename) {
    const auto slash = filename.rfind('/');
    if (slash == std::string::npos || slash < 8 || filename.compare(slash - 8, 8, "/custody") != 0) return false;
    struct ::stat st {};
    return ::stat((filename.substr(0, slash) + "/_library.py").c_str(), &st) == 0;
}

constexpr std::uintptr_t added_bit = std::uintptr_t{1} << 63;
constexpr int most_native = 6; ///< native frames kept above the Python ones, innermost first

/// The Python frames met so far, each once (by code object and line), and the modules whose frames
/// a stack leaves out. Thread safety: one mutex for the table; the module bounds are set once.
struct python_frames {
    python_api api;
    std::mutex mutex;
    std::map<std::pair<void*, int>, std::size_t> index; ///< (code, line) -> position in frames
    std::vector<python_frame> frames;                    ///< never shrinks: a frame's tag is its position
    const void* own_module = nullptr;                    ///< this library's dli_fbase

    /// The tag of (code, line), taking a reference to `code` the first time, and whether it is the
    /// custody package's own; 0 when there is no memory for it. Called with the GIL held.
    std::uintptr_t intern(void* code, int line, bool& custodys) noexcept {
        try {
            std::lock_guard lock(mutex);
            const auto [it, fresh] = index.emplace(std::pair(code, line), frames.size());
            if (fresh) {
                python_frame f{code, line, text_of(code, "co_filename"), text_of(code, "co_qualname"), false};
                if (f.name.empty()) f.name = text_of(code, "co_name");
                f.custodys = in_custody_package(f.filename);
                frames.push_back(std::move(f));
                api.incref(code);
            }
            custodys = frames[it->second].custodys;
            return added_bit | it->second;
        } catch (...) {
            return 0;
        }
    }

    std::string text_of(void* code, const char* attribute) noexcept {
        void* value = api.get_attribute(code, attribute);
        if (value == nullptr) {
            api.clear_error();
            return {};
        }
        const char* text = api.utf8(value);
        std::string out = text != nullptr ? text : "";
        if (text == nullptr) api.clear_error();
        api.decref(value);
        return out;
    }
};

python_frames& state() {
    static auto* const the = new python_frames; // never destroyed: stacks are named until the process ends
    return *the;
}

/// Whether `frame` lies in the interpreter's plumbing between Python and a C call (libffi, the
/// _ctypes module, libpython or a python executable), or in this library itself.
bool left_out(const void* frame, const void* own_module, bool& interpreter) noexcept {
    Dl_info info{};
    interpreter = false;
    if (::dladdr(frame, &info) == 0 || info.dli_fname == nullptr) return false;
    if (info.dli_fbase == own_module) return true;
    std::string_view file(info.dli_fname);
    if (const auto slash = file.rfind('/'); slash != std::string_view::npos) file.remove_prefix(slash + 1);
    for (const std::string_view prefix : {"libffi", "_ctypes", "libpython", "python"}) {
        if (file.substr(0, prefix.size()) == prefix) interpreter = true;
    }
    return interpreter;
}

int rewrite(void* const* raw, int n, void** out, int room) noexcept {
    python_frames& s = state();
    const bool python = s.api.is_initialized() != 0;
    int depth = 0;
    for (int i = 0; i < n && depth < room; ++i) {
        bool interpreter = false;
        if (left_out(raw[i], s.own_module, interpreter)) {
            if (interpreter) break; // what follows is the interpreter running Python: its frames replace it
            continue;
        }
        if (python && depth == most_native) break; // room for the Python frames
        out[depth++] = raw[i];
    }
    if (!python) return depth;
    // As PyTorch's own Python stacks do, the GIL is taken for the walk (a thread that released it
    // inside a PyTorch call still has its Python frames; a C++ thread of PyTorch's has none).
    const int gil = s.api.gil_ensure();
    void* frame = s.api.current_frame(); // borrowed: held while walking, as every frame after it
    if (frame != nullptr) s.api.incref(frame);
    bool on_top = true; // the custody package's frames on top (Library.alloc, ...) are left out
    while (frame != nullptr) {
        void* back = nullptr;
        if (depth < room) {
            if (void* code = s.api.frame_code(frame); code != nullptr) {
                bool custodys = false;
                const std::uintptr_t tag = s.intern(code, s.api.frame_line(frame), custodys);
                on_top = on_top && custodys;
                if (tag != 0 && !on_top) out[depth++] = reinterpret_cast<void*>(tag);
                s.api.decref(code);
            }
            back = s.api.frame_back(frame);
        }
        s.api.decref(frame);
        frame = back;
    }
    s.api.gil_release(gil);
    return depth;
}

bool name(const void* frame, std::string& text) {
    python_frames& s = state();
    const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(frame) & ~added_bit;
    std::lock_guard lock(s.mutex);
    if (at >= s.frames.size()) return false;
    const python_frame& f = s.frames[at];
    text = (f.filename.empty() ? std::string("?") : f.filename) + ":" + std::to_string(f.line) + " in " +
           (f.name.empty() ? std::string("?") : f.name);
    return true;
}

const custody::debug::detail::stack_extension extension{&rewrite, &name};

} // namespace

bool install_python_frames() noexcept {
    python_frames& s = state();
    static const bool loaded = [&] {
        if (!s.api.load()) return false;
        Dl_info info{};
        if (::dladdr(reinterpret_cast<const void*>(&install_python_frames), &info) != 0) s.own_module = info.dli_fbase;
        return true;
    }();
    if (loaded) custody::debug::detail::install_stack_extension(&extension);
    return loaded;
}

} // namespace custody_plugin
