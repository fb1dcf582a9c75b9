"""excerpts_test.py SOURCE_ROOT BUILD_DIR [--cuda-include DIR] -- CXX...: the docs' code and printed
output are what the project builds and prints. In README.md and docs/*.md, a fenced block follows
one of these marks:

  <!-- excerpt: PATH -->          the block is the file PATH (from the source root), whole
  <!-- excerpt: PATH#NAME -->     ... or its region between "[excerpt: NAME]" and "[end excerpt]"
                                  (comment lines of the file, left out), dedented
  <!-- output: COMMAND -->        the block is what COMMAND prints, run in an empty directory:
                                  "python PATH ARGS..." (PATH from the source root, with the host
                                  build of the library: CUSTODY_LIBRARY) or "example NAME ARGS..."
                                  (BUILD_DIR/examples/NAME)
  <!-- compiles, given: DECLS --> a C++ fragment that compiles as a function's body after DECLS
                                  (the names it takes for granted: `stream`, `bytes`, ...), its
                                  #include lines hoisted; a line "..." stands for more code
  <!-- compiles with CUDA, given: DECLS -->   ... against the CUDA Toolkit's headers (--cuda-include;
                                  without it the block is counted as not compiled here)
  <!-- sketch: WHY -->            a C++ sketch that does not compile on its own, and why

Every C++ file an excerpt quotes must be compiled by the build (BUILD_DIR/compile_commands.json
names it), every Python file must compile, and every ```cpp block must carry an excerpt or a
sketch mark: a C++ excerpt that no test builds is the kind that drifts."""
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile
import textwrap

MARK = re.compile(r"^<!-- (excerpt|output|sketch|compiles(?: with CUDA)?)(?:(?:, given)?: (.+?))? -->$")

# What every fragment may take for granted: the headers of the platform it runs on.
PRELUDE = {"compiles": ["#include <custody/buffer/buffer.hpp>", "#include <custody/platform/host.hpp>",
                        "#include <custody/resource/host_memory.hpp>",
                        "#include <custody/resource/simulated_device_memory.hpp>", "#include <cstddef>",
                        "#include <cstdint>", "#include <span>", "#include <vector>"],
           "compiles with CUDA": ["#include <cuda_fp16.h>", "#include <custody/buffer/device_buffer.hpp>",
                                  "#include <custody/interop/nccl/communicator.hpp>",
                                  "#include <custody/platform/cuda.hpp>", "#include <custody/resource/cuda_async.hpp>",
                                  "#include <custody/resource/cuda_malloc.hpp>",
                                  "#include <custody/resource/pinned_host.hpp>",
                                  "#include <custody/staging/staging_ring.hpp>", "#include <cstddef>",
                                  "#include <span>", "#include <vector>"]}


def blocks(text):
    """(line number, language, body, mark kind, mark argument) of each fenced block; the mark is
    the nearest non-empty line before the fence, when it is one."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        before = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        mark = MARK.match(before.strip())
        yield i + 1, fence.group(1), "\n".join(lines[i + 1:end]), mark.group(1) if mark else None, \
            mark.group(2) if mark else None
        i = end + 1


def region(path, name):
    """The lines between the marks of region `name` in `path`, dedented."""
    lines = path.read_text(encoding="utf-8").split("\n")
    begin = [k for k, line in enumerate(lines) if "[excerpt: %s]" % name in line]
    if len(begin) != 1:
        raise AssertionError("%s: %d regions named '%s'" % (path, len(begin), name))
    end = next((k for k in range(begin[0] + 1, len(lines)) if "[end excerpt]" in lines[k]), None)
    if end is None:
        raise AssertionError("%s: region '%s' has no [end excerpt]" % (path, name))
    return textwrap.dedent("\n".join(lines[begin[0] + 1:end]))


def run(command, root, build):
    words = shlex.split(command)
    if words[0] == "python":
        argv = [sys.executable, str(root / words[1])] + words[2:]
    elif words[0] == "example":
        argv = [str(build / "examples" / words[1])] + words[2:]
    else:
        raise AssertionError("an output mark runs 'python PATH ...' or 'example NAME ...', not %r" % command)
    with tempfile.TemporaryDirectory() as directory:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root / "python"),
                                                                         os.environ.get("PYTHONPATH")])))
        done = subprocess.run(argv, cwd=directory, capture_output=True, text=True, env=env, timeout=300)
    if done.returncode != 0:
        raise AssertionError("%s exited %d:\n%s%s" % (command, done.returncode, done.stdout, done.stderr))
    return done.stdout


def fragment_unit(fragments, prelude):
    """One translation unit of C++ fragments, each the body of a function of its own after what it is
    given, with their #include lines hoisted above all of them, after the prelude's."""
    includes, functions = list(prelude), []
    for n, (where, given, body) in enumerate(fragments):
        lines = []
        for line in body.split("\n"):
            if line.strip().startswith("#include"):
                if line.strip() not in includes:
                    includes.append(line.strip())
            elif line.strip() == "...":
                lines.append("// ...")
            else:
                lines.append(line)
        functions.append("// %s\n[[maybe_unused]] static void fragment_%d() {\n%s\n%s\n}\n"
                         % (where, n, given, "\n".join(lines)))
    return "\n".join(includes) + "\n\n" + "\n".join(functions)


def compile_fragments(fragments, prelude, compiler, extra):
    """Compiles the fragments (one unit); the compiler's message when they do not compile, else None."""
    with tempfile.TemporaryDirectory() as directory:
        unit = pathlib.Path(directory) / "fragments.cpp"
        unit.write_text(fragment_unit(fragments, prelude))
        done = subprocess.run(compiler + ["-std=c++20", "-fsyntax-only", "-w"] + extra + [str(unit)],
                              capture_output=True, text=True, timeout=600)
    if done.returncode == 0:
        return None
    return done.stderr[-6000:]


def compiled_files(build):
    path = build / "compile_commands.json"
    if not path.exists():
        return None
    files = set()
    for c in json.loads(path.read_text()):
        source = pathlib.Path(c["directory"], c["file"]).resolve()
        files.add(str(source))
        if "-unity" in source.name and source.exists():  # a unity build's file includes the program's files
            for m in re.finditer(r"^#include\s*[<\"]([^>\"]+)[>\"]", source.read_text(), re.M):
                files.add(str(pathlib.Path(m.group(1)).resolve()))
    return files


def main(argv):
    root, build = pathlib.Path(argv[1]).resolve(), pathlib.Path(argv[2]).resolve()
    options, compiler = argv[3:argv.index("--")] if "--" in argv else argv[3:], \
        argv[argv.index("--") + 1:] if "--" in argv else []
    cuda_include = options[options.index("--cuda-include") + 1] if "--cuda-include" in options else None
    compiled = compiled_files(build)
    failures, counts = [], {"excerpt": 0, "output": 0, "sketch": 0, "compiles": 0, "compiles with CUDA": 0}
    fragments = {"compiles": [], "compiles with CUDA": []}
    for doc in [root / "README.md"] + sorted((root / "docs").glob("*.md")):
        for line, language, body, kind, argument in blocks(doc.read_text(encoding="utf-8")):
            where = "%s:%d" % (doc.relative_to(root), line)
            try:
                if kind == "excerpt":
                    path, _, name = argument.partition("#")
                    source = root / path
                    expected = region(source, name) if name else source.read_text(encoding="utf-8").rstrip("\n")
                    if body != expected:
                        raise AssertionError("the block is not %s as it is now; it reads:\n%s" % (argument, expected))
                    if source.suffix == ".py":
                        compile(source.read_text(encoding="utf-8"), str(source), "exec")
                    elif compiled is not None and str(source.resolve()) not in compiled:
                        raise AssertionError("%s is quoted, but no target of the build compiles it" % path)
                elif kind == "output":
                    printed = run(argument, root, build).rstrip("\n")
                    if [l.rstrip() for l in body.split("\n")] != [l.rstrip() for l in printed.split("\n")]:
                        raise AssertionError("`%s` prints:\n%s" % (argument, printed))
                elif kind in fragments:
                    fragments[kind].append((where, argument or "", body))
                elif language == "cpp":
                    if kind != "sketch":
                        raise AssertionError("a C++ block without a mark: quote a file the build compiles "
                                             "(<!-- excerpt: PATH -->), or say why it is a sketch (<!-- sketch: WHY -->)")
                if kind:
                    counts[kind] += 1
            except (AssertionError, OSError, SyntaxError, subprocess.TimeoutExpired) as e:
                failures.append("%s: %s" % (where, e))
    include = ["-I", str(root / "include")]
    if not compiler:
        failures.append("no compiler given (-- CXX ...): the fragments were not compiled")
    else:
        if fragments["compiles"]:
            message = compile_fragments(fragments["compiles"], PRELUDE["compiles"], compiler, include)
            if message:
                failures.append("the C++ fragments (%s) do not compile:\n%s"
                                % (", ".join(w for w, _, _ in fragments["compiles"]), message))
        if fragments["compiles with CUDA"] and cuda_include:
            message = compile_fragments(fragments["compiles with CUDA"], PRELUDE["compiles with CUDA"], compiler,
                                        include + ["-isystem", cuda_include, "-DCUSTODY_WITH_CUDA"])
            if message:
                failures.append("the CUDA fragments (%s) do not compile:\n%s"
                                % (", ".join(w for w, _, _ in fragments["compiles with CUDA"]), message))
    cuda_note = "" if cuda_include else " (not compiled here: no CUDA Toolkit)"
    print("%d excerpts of files, %d outputs checked; %d fragments compiled, %d CUDA fragments%s; %d C++ sketches"
          % (counts["excerpt"], counts["output"], counts["compiles"], counts["compiles with CUDA"], cuda_note,
             counts["sketch"]))
    for f in failures:
        print("FAIL " + f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
