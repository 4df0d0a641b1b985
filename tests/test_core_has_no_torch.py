"""The analysis core runs on laptops without torch: analyzing a trace must not import torch or triton."""

import subprocess
import sys
from pathlib import Path

TRACE = Path(__file__).parent / "fixtures" / "traces" / "hf_llama_generate_6steps.json.gz"


def test_analyze_imports_neither_torch_nor_triton():
    code = (
        "import sys\n"
        "from decodegap.cli import main\n"
        f"try:\n    main(['analyze', {str(TRACE)!r}, '--format', 'json', '-o', '/dev/null'])\n"
        "except SystemExit:\n    pass\n"
        "from decodegap import floor\nfrom decodegap.floor import ledger\nfrom decodegap.report import diff\n"
        "bad = [m for m in ('torch', 'triton') if m in sys.modules]\n"
        "print('IMPORTED', bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "IMPORTED []" in out.stdout, out.stdout + out.stderr
