"""app/common/devices.py: a GPU asked for and absent stops in one line saying what torch sees and how to fix
it; `auto` alone falls back to the CPU, and says so. This machine's torch may see no GPU: the refusals are
tested there, and on a GPU machine an index past its devices is."""

from __future__ import annotations

import pytest
import torch

from app.common.devices import cuda_seen, resolve
from app.common.errors import UserError
from app.generate import main as generate_main

NO_GPU = not torch.cuda.is_available()


def test_what_torch_sees_is_said_in_words():
    seen = cuda_seen()
    if torch.version.cuda is None:
        assert seen == f"torch {torch.__version__} is a CPU-only build (no CUDA)"
    elif NO_GPU:
        assert seen.startswith(f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device")
    else:
        assert seen.endswith(f"sees {torch.cuda.device_count()} CUDA device(s)")


@pytest.mark.skipif(not NO_GPU, reason="torch sees a GPU here: nothing to refuse")
@pytest.mark.parametrize("name", ["cuda", "cuda:0", "cuda:3"])
def test_a_gpu_asked_for_without_one_is_one_line_saying_why_and_how(name):
    with pytest.raises(UserError) as e:
        resolve(name, "--device")
    assert str(e.value).startswith(f"--device {name}: {cuda_seen()}; ")
    assert str(e.value).endswith("run on the CPU (--device cpu, or --device auto)")
    assert "\n" not in str(e.value)


def test_auto_falls_back_and_says_which_device_it_chose():
    said: list[str] = []
    dev = resolve("auto", "--device", said.append)
    if NO_GPU:
        assert dev == torch.device("cpu") and said == [f"--device auto: cpu, as {cuda_seen()}"]
    else:
        assert dev.type == "cuda" and said == [f"--device auto: {dev}, {torch.cuda.get_device_name(dev)}"]
    assert resolve("cpu", "--device", said.append) == torch.device("cpu") and len(said) == 1
    with pytest.raises(UserError, match=r"^--device 'tpu': expected cpu, cuda, cuda:N or auto$"):
        resolve("tpu", "--device")


@pytest.mark.gpu
def test_an_index_past_the_devices_is_one_line():
    n = torch.cuda.device_count()
    with pytest.raises(UserError, match=rf"^--device cuda:{n}: .* sees {n} CUDA device\(s\); pick one of"):
        resolve(f"cuda:{n}", "--device")


@pytest.mark.skipif(not NO_GPU, reason="torch sees a GPU here: nothing to refuse")
def test_generate_with_device_cuda_stops_before_reading_anything(tmp_path, capsys):
    """Base 2652e8d said "CUDA is not available on this machine", neither what torch sees nor the fix."""
    rc = generate_main(["--checkpoint", str(tmp_path / "absent"), "--device", "cuda", "--prompt", "a"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: --device cuda: {cuda_seen()}; ")
