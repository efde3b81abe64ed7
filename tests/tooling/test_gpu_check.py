"""bench/gpu_check.py, the prepared CUDA check: it refuses loudly without CUDA, and its logic
(replay from real Pong frames, learner steps, the falling-loss check) runs as a CPU dry run."""

import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def load_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_cuda_it_fails_loudly(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert load_check().main(["--device", "cuda"]) == 1
    assert "gpu_check: FAILED: --device cuda: torch" in capsys.readouterr().err


@pytest.mark.slow
def test_cpu_dry_run_trains_and_checks_the_loss(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    code = load_check().main(
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
    assert out.exists()
