"""What checking ``kb.safetensors`` against its checksum costs, and what happens to a process
whose memory-mapped KB file is changed under it (docs/scale.md, "Updating a pipeline in place").

    python bench/kb_integrity.py digest [--mb 1049] [--repeats 3]
    python bench/kb_integrity.py swap [--concepts 60000]

``digest``: writes a safetensors file of ``--mb`` MB of random int64 arrays (1,049 MB is the
10M-name KB of docs/scale.md) in a temporary folder, then in a fresh process maps it and
times :func:`~spacy_genbioel.kb.compact_build.content_digest` over it (what ``CompactKB.open``
checks): wall and CPU seconds per run, its RSS before and its peak RSS (VmHWM), as JSON lines.

``swap``: builds a compact KB, has a child process open it, then changes the file while the
child waits (truncated to 4 KB; overwritten by ``cp`` with a smaller KB; replaced by a rename;
deleted) and lets the child read every name and concept: its exit status (-7 is SIGBUS) and
the last line of its error output, one JSON line per case. Timings depend on the machine and
its load.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

MEASURE = r"""
import json, sys, time
from spacy_genbioel.arrayfile import read_arrays
from spacy_genbioel.kb.compact_build import content_digest

def status(key):  # this process's own figures (ru_maxrss would count the parent's pages at fork)
    line = next(l for l in open("/proc/self/status") if l.startswith(key + ":"))
    return round(int(line.split()[1]) / 1024, 1)

arrays, _ = read_arrays(sys.argv[1])
print(json.dumps({"rss_mb_before": status("VmRSS")}), flush=True)
for run in range(int(sys.argv[2])):
    wall, cpu = time.perf_counter(), time.process_time()
    content_digest(arrays)
    print(json.dumps({"run": run, "wall_s": round(time.perf_counter() - wall, 3),
                      "cpu_s": round(time.process_time() - cpu, 3), "peak_rss_mb": status("VmHWM")}), flush=True)
"""

READER = r"""
import sys
from spacy_genbioel.kb.compact import CompactKB
kb = CompactKB.open(sys.argv[1])
print("opened", flush=True)
sys.stdin.readline()
print(len(list(kb.names)), sum(1 for _ in kb), flush=True)
"""


def digest(mb: int, repeats: int) -> None:
    import numpy as np

    from spacy_genbioel.arrayfile import write_arrays

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.safetensors"
        rng = np.random.default_rng(0)
        per = mb * 1_000_000 // 8 // 4
        write_arrays(path, {f"a{i}": rng.integers(0, 2**62, size=per, dtype=np.int64) for i in range(4)}, {})
        print(json.dumps({"file_mb": round(path.stat().st_size / 1e6)}), flush=True)
        subprocess.run([sys.executable, "-c", MEASURE, str(path), str(repeats)], check=True)


def swap(n_concepts: int) -> None:
    from spacy_genbioel.kb.base import Concept
    from spacy_genbioel.kb.compact import CompactKB

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        old, new = work / "old.safetensors", work / "new.safetensors"
        CompactKB.build([Concept(f"D{i:06d}", [f"name number {i} of a longer list"]) for i in range(n_concepts)]).save(
            old
        )
        CompactKB.build([Concept(f"E{i:06d}", [f"another name {i}"]) for i in range(n_concepts * 2 // 3)]).save(new)
        for case in ("truncate to 4 KB", "cp a smaller KB over it", "rename a new file over it", "delete it"):
            live = work / "live.safetensors"
            shutil.copy(old, live)
            child = subprocess.Popen(
                [sys.executable, "-c", READER, str(live)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            child.stdout.readline()
            if case.startswith("truncate"):
                os.truncate(live, 4096)
            elif case.startswith("cp"):
                subprocess.run(["cp", str(new), str(live)], check=True)  # cp opens the target with O_TRUNC
            elif case.startswith("rename"):
                shutil.copy(new, work / "staged.safetensors")
                os.replace(work / "staged.safetensors", live)
            else:
                live.unlink()
            out, err = child.communicate("go\n")
            last = (err.strip().splitlines() or [""])[-1]
            print(
                json.dumps(
                    {
                        "case": case,
                        "exit": child.returncode,
                        "sigbus": child.returncode == -7,
                        "stdout": out.strip(),
                        "error": last[:160],
                    }
                ),
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    d = sub.add_parser("digest")
    d.add_argument("--mb", type=int, default=1049)
    d.add_argument("--repeats", type=int, default=3)
    s = sub.add_parser("swap")
    s.add_argument("--concepts", type=int, default=60000)
    args = parser.parse_args()
    if args.what == "digest":
        digest(args.mb, args.repeats)
    else:
        swap(args.concepts)


if __name__ == "__main__":
    main()
