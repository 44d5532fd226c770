"""The command line starts without the heavy libraries: ``python -m spacy_genbioel --help`` and every command's
``--help`` import neither torch, transformers, thinc nor spaCy (each command imports what it needs when it runs)."""

import json
import subprocess
import sys

HEAVY = ("torch", "transformers", "thinc", "spacy")

# runs ``python -m spacy_genbioel ARGS`` in this process for the top-level help and each command's (hidden ones too),
# then prints, as its last line, the exit codes and the heavy modules loaded
CHILD = f"""
import json, runpy, sys

import typer


def run(args):
    sys.argv = ["spacy_genbioel", *args]
    try:
        runpy.run_module("spacy_genbioel", run_name="__main__", alter_sys=True)
    except SystemExit as exit:
        return exit.code or 0
    return 0


codes = {{"--help": run(["--help"])}}
from spacy_genbioel.cli import app

for name in sorted(typer.main.get_command(app).commands):
    codes[name] = run([name, "--help"])
print(json.dumps({{"codes": codes, "heavy": sorted(m for m in {HEAVY!r} if m in sys.modules)}}))
"""


def test_help_imports_no_heavy_library():
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"--help", "annotate", "evaluate", "package", "pretrain"} <= set(report["codes"])
    assert all(code == 0 for code in report["codes"].values()), report["codes"]
    assert report["heavy"] == []
