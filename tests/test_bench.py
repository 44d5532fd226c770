"""The benchmark scripts parse, and refuse what they do not know, without running anything heavy."""
import os
import subprocess
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.parametrize("script", sorted(BENCH.glob("*.sh")), ids=lambda p: p.name)
def test_shell_scripts_parse(script):
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_variants_and_ablations_reject_unknown_names(tmp_path):
    bad = subprocess.run(["bash", str(BENCH / "variants.sh"), "medmentions", str(tmp_path)], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown corpus" in bad.stderr
    usage = subprocess.run(["bash", str(BENCH / "ablations.sh")], capture_output=True, text=True)
    assert usage.returncode == 2 and "Table 4" in usage.stdout
    bad = subprocess.run(["bash", str(BENCH / "ablations.sh"), "run", "nonsense"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path)})
    assert bad.returncode == 2 and "unknown variant" in bad.stderr


def test_ablation_table_reads_results(tmp_path):
    run = tmp_path / "run_tfidf"
    run.mkdir()
    (run / "result.json").write_text('{"step": 400, "seconds": 900.4, "evaluations": '
                                     '[{"step": 400, "eval": {"recall@1": 0.85, "recall@5": 0.9}}]}')
    out = subprocess.run(["bash", str(BENCH / "ablations.sh"), "table"], capture_output=True, text=True, check=True,
                         env={"PATH": os.environ["PATH"], "OUT": str(tmp_path)})
    assert "| tfidf | 400 | 0.8500 | 0.9000 | 900 |" in out.stdout
