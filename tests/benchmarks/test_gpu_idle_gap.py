"""The idle-gap arithmetic of benchmarks.gpu_idle_gap (the measurement itself needs CUDA)."""

import pytest
import torch

from benchmarks.gpu_idle_gap import busy_fraction, main


def test_busy_time_is_the_union_of_kernel_intervals():
    assert busy_fraction([]) == (0.0, 0.0)
    busy, span = busy_fraction([(10, 20), (0, 5), (15, 30), (40, 50)])  # overlapping kernels count once
    assert (busy, span) == (5 + 20 + 10, 50)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path: a clear no-op")
def test_without_cuda_it_says_so(capsys, tmp_path):
    main(["--out", str(tmp_path)])
    assert "no CUDA device" in capsys.readouterr().err and not list(tmp_path.iterdir())
