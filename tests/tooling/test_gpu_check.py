"""bench/gpu_check.py, the prepared CUDA check: it refuses loudly without CUDA, and its logic
(replay from real Pong frames, learner steps, the falling-loss check) runs as a CPU dry run."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def load_bench(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_check(monkeypatch):
    """bench/gpu_check.py as `python bench/gpu_check.py` sees it: its `import common` is bench/common.py
    (given here for this test only, as the script's folder on sys.path gives it there)."""
    monkeypatch.setitem(sys.modules, "common", load_bench("common"))
    return load_bench("gpu_check")


def test_without_cuda_it_fails_loudly(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert load_check(monkeypatch).main(["--device", "cuda"]) == 1
    assert "gpu_check: FAILED: --device cuda: torch" in capsys.readouterr().err


@pytest.mark.slow
def test_cpu_dry_run_trains_and_checks_the_loss(tmp_path, capsys, monkeypatch):
    out = tmp_path / "gpu.json"
    code = load_check(monkeypatch).main(
        [
            "--device",
            "cpu",
            "--steps",
            "10",
            "--batch",
            "8",
            "--transitions",
            "300",
            "--warmup",
            "2",
            "--max-final-ratio",
            "1.0",
            "--json",
            str(out),
        ]
    )
    text = capsys.readouterr().out
    assert code == 0 and "gpu_check: passed" in text and "learner steps/s" in text
    result = json.loads(out.read_text())
    assert result["steps"] == 10 and result["machine"]["cpus"] > 0  # bench/common.py's machine block
