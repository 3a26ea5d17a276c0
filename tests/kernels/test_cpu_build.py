"""The C++ kernels' build cache: shared by checkouts of the same sources, never blocked by a dead build."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_checkouts_of_the_same_sources_compile_the_same_files(tmp_path, monkeypatch):
    """Two checkouts (worktrees, an installed copy) hand the build the same source paths, so the second
    reuses the first's build instead of recompiling (ninja rebuilds when a source path changes)."""
    import testbed_kernels.cpu

    built = []
    for checkout in ("a", "b"):
        folder = tmp_path / checkout
        folder.mkdir()
        for name in ("paged_decode.cpp", "ops.h"):
            (folder / name).write_text(f"// {name}\n")
        monkeypatch.setattr(testbed_kernels.cpu, "__file__", str(folder / "__init__.py"))
        monkeypatch.setattr(testbed_kernels.cpu, "_SOURCES", [folder / "paged_decode.cpp"])
        built.append(testbed_kernels.cpu._stable_sources(tmp_path / "build" / "src"))
    assert built[0] == built[1] == [tmp_path / "build" / "src" / "paged_decode.cpp"]
    assert (tmp_path / "build" / "src" / "ops.h").read_text() == "// ops.h\n"


def test_a_build_killed_midway_does_not_block_the_next_process(cpu_kernels):
    """torch's build lock file outlives a killed build; the next process must not wait on it forever."""
    from torch.utils.cpp_extension import _get_build_directory

    folder = Path(_get_build_directory(f"testbed_cpu_kernels_{cpu_kernels._build_tag()}", verbose=False))
    (folder / "lock").touch()  # what a build killed mid-way leaves
    code = "import testbed_kernels.cpu; testbed_kernels.cpu.load(); print('loaded')"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "loaded" in done.stdout, done.stderr
    assert not (folder / "lock").exists()
