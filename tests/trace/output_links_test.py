#!/usr/bin/env python3
"""Every file custody's tools write is made new and renamed into place: a symbolic link or a hard
link planted where a tool writes (its output's name, or the name its temporary file had, planted
for the tool's own process id before it starts) is never written through, and what it points to
is left as it was. Each tool that writes a file, each of its outputs.

usage: output_links_test.py CUSTODY_IMPORT CUSTODY_TRACE CUSTODY_REPLAY CUSTODY_PLOT CUSTODY_MERGE RANK_REPORT"""

import os
import pickle
import stat
import subprocess
import sys
import tempfile
import unittest

IMPORT = TRACE_TOOL = REPLAY = PLOT = MERGE = RANK_REPORT = None
COLUMNS = "sequence,time_ns,action,thread,stream,device,bytes,alignment,address,owner,flags"
VICTIM = b"someone else's file\n"

try:
    import matplotlib  # noqa: F401
    HAVE_MATPLOTLIB = True
except ImportError:
    HAVE_MATPLOTLIB = False


def run(args, plant=None):
    """Runs a tool; `plant(pid)` runs in the tool's own process before it starts (its pid is the
    tool's), as another user who plants links for the next process ids would."""
    preexec = (lambda: plant(os.getpid())) if plant else None
    return subprocess.run([str(a) for a in args], capture_output=True, timeout=300, preexec_fn=preexec)


class Writers(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.elsewhere = tempfile.TemporaryDirectory()  # the victim's directory, not the output's
        self.addCleanup(self.elsewhere.cleanup)
        self.inputs = self.make_inputs()

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def make_inputs(self):
        snapshot = self.path("snap.pickle")
        with open(snapshot, "wb") as f:
            pickle.dump({"segments": [], "device_traces": [[
                {"action": "alloc", "addr": 0x1000, "size": 512, "stream": 0, "time_us": 1},
                {"action": "free_completed", "addr": 0x1000, "size": 512, "stream": 0, "time_us": 2}]]}, f)
        rmm = self.path("rmm.csv")
        with open(rmm, "w") as f:
            f.write("Thread,Time,Action,Pointer,Size,Stream\n1,10:00:00.0,allocate,0x1000,64,0x0\n"
                    "1,10:00:00.1,free,0x1000,64,0x0\n")
        csv = self.path("t.csv")
        with open(csv, "w") as f:
            f.write(COLUMNS + "\n1,100,allocate,0,0x0,0,1048576,256,0x10000000,,\n"
                    "2,200,deallocate,0,0x0,0,1048576,256,0x10000000,,\n")
        trace = self.path("t.ctrace")
        self.assertEqual(run([TRACE_TOOL, "from-csv", csv, trace]).returncode, 0)
        report = self.path("replay.json")
        p = run([REPLAY, "--repetitions", "1", "--json", report, trace, "malloc"])
        self.assertEqual(p.returncode, 0, p.stderr)
        return {"snapshot": snapshot, "rmm": rmm, "csv": csv, "trace": trace, "report": report}

    def writers(self):
        """(name, the command writing `out`) for every file a tool writes."""
        i = self.inputs
        found = [
            ("custody-import pytorch", lambda out: IMPORT + ["pytorch", i["snapshot"], "-o", out]),
            ("custody-import rmm", lambda out: IMPORT + ["rmm", i["rmm"], "-o", out]),
            ("custody-trace csv", lambda out: [TRACE_TOOL, "csv", i["trace"], out]),
            ("custody-trace from-csv", lambda out: [TRACE_TOOL, "from-csv", i["csv"], out]),
            ("custody-replay --json", lambda out: [REPLAY, "--repetitions", "1", "--json", out, i["trace"], "malloc"]),
            ("custody-replay --perfetto",
             lambda out: [REPLAY, "--repetitions", "1", "--perfetto", out, i["trace"], "malloc"]),
            ("custody-merge --table", lambda out: [MERGE, "--table", out, RANK_REPORT]),
            ("custody-merge --trace", lambda out: [MERGE, "--trace", out, RANK_REPORT]),
        ]
        if HAVE_MATPLOTLIB:
            found.append(("custody-plot", lambda out: PLOT + [i["report"], "-o", out]))
        return found

    def victim(self, name):
        p = os.path.join(self.elsewhere.name, name)
        with open(p, "wb") as f:
            f.write(VICTIM)
        return p

    def assert_written_anew(self, tool, out, victim, p):
        self.assertEqual(p.returncode, 0, "%s: %s" % (tool, p.stderr.decode(errors="replace")))
        with open(victim, "rb") as f:
            self.assertEqual(f.read(), VICTIM, "%s wrote through a link into another file" % tool)
        st = os.lstat(out)
        self.assertTrue(stat.S_ISREG(st.st_mode), "%s: the output is not a regular file" % tool)
        self.assertEqual(st.st_nlink, 1, "%s: the output shares its inode with another name" % tool)
        self.assertGreater(st.st_size, 0, tool)
        leftovers = [n for n in os.listdir(self.dir.name) if ".partial-" in n and not os.path.islink(self.path(n))]
        self.assertEqual(leftovers, [], "%s left a temporary file behind" % tool)

    def test_a_symbolic_link_at_the_output_is_replaced_not_followed(self):
        for k, (tool, command) in enumerate(self.writers()):
            with self.subTest(tool=tool):
                victim = self.victim("symlinked-%d" % k)
                out = self.path("out-s%d" % k + (".png" if tool == "custody-plot" else ""))
                os.symlink(victim, out)
                self.assert_written_anew(tool, out, victim, run(command(out)))

    def test_a_dangling_link_at_the_output_creates_nothing_where_it_points(self):
        for k, (tool, command) in enumerate(self.writers()):
            with self.subTest(tool=tool):
                target = os.path.join(self.elsewhere.name, "planted-%d" % k)
                out = self.path("out-d%d" % k + (".png" if tool == "custody-plot" else ""))
                os.symlink(target, out)
                p = run(command(out))
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertFalse(os.path.lexists(target), "%s created the file a dangling link names" % tool)
                self.assertTrue(stat.S_ISREG(os.lstat(out).st_mode))

    def test_a_hard_link_at_the_output_keeps_the_other_name_as_it_was(self):
        for k, (tool, command) in enumerate(self.writers()):
            with self.subTest(tool=tool):
                victim = self.path("hard-victim-%d" % k)  # a hard link needs one file system
                with open(victim, "wb") as f:
                    f.write(VICTIM)
                out = self.path("out-h%d" % k + (".png" if tool == "custody-plot" else ""))
                os.link(victim, out)
                self.assert_written_anew(tool, out, victim, run(command(out)))

    def test_links_planted_at_the_temporary_names_are_never_written_through(self):
        for k, (tool, command) in enumerate(self.writers()):
            with self.subTest(tool=tool):
                victim = self.victim("temporary-%d" % k)
                out = self.path("out-t%d" % k + (".png" if tool == "custody-plot" else ""))

                def plant(pid, out=out, victim=victim):
                    for name in ("%s.partial-%d" % (out, pid), "%s.partial-%d.png" % (out, pid),
                                 "%s.tmp" % out, "%s~" % out):
                        os.symlink(victim, name)

                self.assert_written_anew(tool, out, victim, run(command(out), plant))


    def test_a_device_is_written_in_place_never_replaced(self):
        # A private copy of /dev/null (root only): the system's own /dev is never at stake.
        device = self.path("null")
        try:
            os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            self.skipTest("making a device node needs root")
        ours = self.path("link-to-null")
        os.symlink(device, ours)
        for tool, command in self.writers():
            for out in (device, ours):
                with self.subTest(tool=tool, out=os.path.basename(out)):
                    p = run(command(out))
                    self.assertEqual(p.returncode, 0, p.stderr)
                    self.assertTrue(stat.S_ISCHR(os.stat(device).st_mode))
                    self.assertTrue(stat.S_ISCHR(os.lstat(device).st_mode), "%s replaced the device" % tool)
                    self.assertTrue(os.path.islink(ours), "%s replaced a link of ours to a device" % tool)


if __name__ == "__main__":
    IMPORT = [sys.executable, sys.argv[1]]
    TRACE_TOOL, REPLAY = sys.argv[2], sys.argv[3]
    PLOT = [sys.executable, sys.argv[4]]
    MERGE, RANK_REPORT = sys.argv[5], sys.argv[6]
    unittest.main(argv=sys.argv[:1], verbosity=2)
