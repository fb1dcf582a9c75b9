"""check_memory_snapshot.py MEMORY_SNAPSHOT CUSTODY_IMPORT: runs the memory_snapshot example with the
tracker's canaries on and off, reads the pickle it wrote as PyTorch's viewer does, and checks that
what is drawn is what is there: every live block once, at the address its user holds, which is the
address its trace entries name; custody-import finds no block allocated before the trace."""
import os
import pickle
import re
import subprocess
import sys
import tempfile


def check(example, importer, directory, canaries):
    path = os.path.join(directory, "snapshot-%s.pickle" % ("on" if canaries else "off"))
    run = subprocess.run([example, path] + ([] if canaries else ["--no-canaries"]), capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    print(run.stdout.strip())
    live = int(re.search(r"(\d+) live blocks", run.stdout).group(1))
    with open(path, "rb") as f:
        snapshot = pickle.load(f)

    active = []
    for segment in snapshot["segments"]:
        at = segment["address"]
        for block in segment["blocks"]:
            assert block["address"] == at, "blocks tile their segment"
            at += block["size"]
            if block["state"].startswith("active"):
                active.append(block["address"])
        assert at == segment["address"] + segment["total_size"]
    assert len(active) == live, "%d active blocks for %d live" % (len(active), live)
    assert len(set(active)) == len(active), "a block drawn twice"

    allocated = {}
    for entry in snapshot["device_traces"][0]:
        if entry["action"] == "alloc":
            allocated[entry["addr"]] = entry
        elif entry["action"] == "free_completed":
            allocated.pop(entry["addr"])
    assert set(allocated) == set(active), "live alloc events at %s, blocks at %s" % (
        sorted(set(allocated) - set(active))[:3], sorted(set(active) - set(allocated))[:3])
    for segment in snapshot["segments"]:
        for block in segment["blocks"]:
            if block["state"].startswith("active"):
                event = allocated[block["address"]]
                assert block["requested_size"] == event["size"]
                assert block["frames"][-1]["name"] == event["user_metadata"]  # the owner, as the event names it

    imported = subprocess.run([sys.executable, importer, "pytorch", path, "-o", path + ".trace"],
                              capture_output=True, text=True)
    assert imported.returncode == 0, imported.stderr
    assert "(0 live before the trace began)" in imported.stderr, imported.stderr
    print("canaries %s: %d live blocks drawn once each, at the addresses their events name; custody-import: %s"
          % ("on" if canaries else "off", live, imported.stderr.strip().split(": ")[-1]))


def main(argv):
    example, importer = argv[1:3]
    with tempfile.TemporaryDirectory() as directory:
        for canaries in (True, False):
            check(example, importer, directory, canaries)
    print("memory_snapshot: the snapshot draws what is there, with the tracker's canaries on and off")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
