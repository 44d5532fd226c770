"""What the progress bars cost: reading records with and without an InputProgress,
and steps with and without a StepProgress (spacy_genbioel/progress.py).

    python bench/progress_overhead.py [--records 200000] [--repeats 3]

Writes a synthetic gzip JSONL file to a temporary folder, reads it with
annotate's reader (``read_records``) and with the KB readers' opener
(``util.iter_json_lines``) bare, inside ``InputProgress.read`` with no bar, and
with a bar drawn into a terminal-like sink (``GENBIOEL_PROGRESS=1``, output to
a discarded stream); then times ``StepProgress.update`` alone. Prints the best
of ``--repeats`` rounds (the variants run in turn in each) as JSON. Timings
depend on the machine and its load.
"""

import argparse
import gzip
import io
import json
import os
import random
import tempfile
import time
from pathlib import Path

from spacy_genbioel.annotate.readers import read_records
from spacy_genbioel.progress import ENV, InputProgress, StepProgress
from spacy_genbioel.util import iter_json_lines


class Sink(io.StringIO):
    def isatty(self):
        return True

    def write(self, text):
        return len(text)


def best(fns, repeats):
    """The best time of each function over ``repeats`` rounds, run in turn (so a change of load hits all)."""
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            began = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - began)
    return {name: min(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "docs.jsonl.gz"
        with gzip.open(path, "wt", encoding="utf8") as handle:
            for i in range(args.records):
                handle.write(
                    json.dumps(
                        {
                            "id": i,
                            "text": " ".join(rng.choice(["renal", "failure", "acute", "liver"]) for _ in range(30)),
                        }
                    )
                    + "\n"
                )
        results = {"records": args.records, "gz_bytes": os.path.getsize(path)}
        for name, reader in (
            ("annotate_reader", lambda: read_records([path])),
            ("kb_reader", lambda: iter_json_lines(path)),
        ):

            def drain(items):
                for _ in items:
                    pass

            def bar_off(reader=reader):
                drain(InputProgress("bench", [path], counts=("docs",), enabled=False).read(reader(), count="docs"))

            def bar_on(reader=reader):
                with InputProgress("bench", [path], counts=("docs",), file=Sink()) as bar:
                    drain(bar.read(reader(), count="docs"))

            timed = best({"bare": lambda reader=reader: drain(reader()), "off": bar_off, "on": bar_on}, args.repeats)
            bare, off, on = timed["bare"], timed["off"], timed["on"]
            results[name] = {
                "bare_s": round(bare, 3),
                "no_bar_s": round(off, 3),
                "bar_s": round(on, 3),
                "bar_overhead_us_per_record": round((on - bare) / args.records * 1e6, 2),
            }

        def steps(enabled):
            bar = StepProgress.start("bench", args.records, max_seconds=3600, enabled=enabled, file=Sink())
            for _ in range(args.records):
                bar.update(1, loss="0.1")
            bar.close()

        timed = best({"no_bar": lambda: steps(False), "bar": lambda: steps(True)}, args.repeats)
        results["step_update_us"] = {k: round(v / args.records * 1e6, 2) for k, v in timed.items()}
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    os.environ.setdefault(ENV, "1")
    main()
