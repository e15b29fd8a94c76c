"""app/classifying/parts.py: a resume cannot mix inputs. Each part records the digest of the input bytes it
was made from; a rerun after a kill reads the input again and classifies afresh each chunk whose bytes
differ, even when the rewrite kept the file's path, size and modification time (a regenerated export,
`rsync -t`): the output is the bytes a fresh run of the new input writes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from launcher import ROOT, env, run
from test_classify import write_rows
from test_classifying_inputs import cheap_classifier, texts


def classify_process(*args, faults: str = "") -> subprocess.Popen:
    cmd = [sys.executable, "app/classify.py", *map(str, args)]
    extra = {"MLSTM_DS_FAULTS": faults} if faults else {}
    return subprocess.Popen(cmd, cwd=ROOT, env=env(**extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip


def test_a_rewrite_that_keeps_size_and_time_is_classified_afresh(tmp_path):
    folder = cheap_classifier(tmp_path, ["neg", "pos"])
    sentences = [s for s in texts(200) if s.isascii()][:120]
    src = write_rows(tmp_path / "in.csv", [{"id": i, "text": s} for i, s in enumerate(sentences)])
    before = src.stat()
    args = ("--classifier", folder, "--input", src, "--chunk-rows", "10", "--keep-fields", "id")
    out = tmp_path / "labels.csv"
    p = classify_process(*args, "--output", out, faults="hang_after_part=3")
    parts, deadline = tmp_path / "labels.csv.parts", time.time() + 600
    while len(list(parts.glob("part-*.json"))) < 3 and p.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    os.killpg(p.pid, signal.SIGKILL)
    p.communicate()
    assert len(list(parts.glob("part-*.json"))) == 3 and not out.exists()
    # the export is regenerated: other texts (letters swapped), the same size, the old modification time
    data = src.read_bytes()
    header, body = data.split(b"\n", 1)
    swapped = header + b"\n" + body.translate(bytes.maketrans(b"aeiou", b"eioua"))
    assert len(swapped) == len(data) and swapped != data
    src.write_bytes(swapped)
    os.utime(src, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (src.stat().st_size, src.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    again = run([sys.executable, "app/classify.py", *map(str, args), "--output", str(out)], timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "3 chunks classified afresh: the input's bytes there are not those" in again.stdout, again.stdout
    fresh = tmp_path / "fresh.csv"
    ref = run([sys.executable, "app/classify.py", *map(str, args), "--output", str(fresh)], timeout=600)
    assert ref.returncode == 0, ref.stderr[-3000:]
    assert out.read_bytes() == fresh.read_bytes()
    assert src.read_bytes() == swapped  # the user's file as they left it
