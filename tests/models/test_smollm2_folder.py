"""The built-in model's folder is converted once even when processes start together (test workers,
cluster replicas, tensor-parallel ranks): the others wait on its lock and then read the finished folder."""

import json
import threading
import time

from testbed.models import smollm2


def test_concurrent_first_uses_convert_once_and_all_see_the_whole_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path))
    monkeypatch.setattr(smollm2, "gguf_path", lambda: tmp_path / smollm2.GGUF_NAME)
    calls = []

    def convert(source, folder):  # stands in for the ~30 s dequantization; slow enough to overlap
        calls.append(folder)
        time.sleep(0.3)
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        (folder / smollm2._DONE_MARKER).write_text(json.dumps({"source": str(source)}))

    monkeypatch.setattr(smollm2, "_convert", convert)
    seen, errors = [], []

    def first_use():
        try:
            folder = smollm2.ensure_smollm2_folder()
            seen.append(sorted(p.name for p in folder.iterdir()))
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=first_use) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(calls) == 1
    assert seen == [["config.json", smollm2._DONE_MARKER]] * 4
    assert smollm2.ensure_smollm2_folder() == tmp_path / "smollm2-135m" and len(calls) == 1
