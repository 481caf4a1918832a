"""REVIEW H2: a flash-attn whose CUDA extension does not import (built for another torch) is refused in one line
before the model loads, naming the package and this process's torch/CUDA."""

from __future__ import annotations

import sys

import pytest
import torch

from verl.utils import attn_impl


def _fake_flash_attn(root, extension_body: str):
    pkg = root / "flash_attn"
    pkg.mkdir()
    # as flash-attn 2.8: the package's interface imports the top-level compiled module
    (pkg / "__init__.py").write_text("__version__ = '2.8.3'\nimport flash_attn_2_cuda as flash_attn_gpu\n")
    (root / "flash_attn_2_cuda.py").write_text(extension_body)


@pytest.fixture
def fake_site(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("flash_attn", "flash_attn_2_cuda"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield tmp_path
    for name in ("flash_attn", "flash_attn_2_cuda"):
        sys.modules.pop(name, None)


def test_extension_with_undefined_symbol_gives_the_one_line_refusal(fake_site):
    _fake_flash_attn(
        fake_site, "raise ImportError('/x/flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDeviceEi')\n"
    )
    reason = attn_impl.flash_attn_importable()
    assert reason is not None and "\\n" not in reason and "\n" not in reason
    assert reason.startswith("flash-attn")
    assert "undefined symbol: _ZN3c104cuda9SetDeviceEi" in reason
    assert f"torch {torch.__version__}, CUDA {torch.version.cuda}" in reason
    assert "actor_rollout_ref.model.attn_implementation=sdpa" in reason
    with pytest.raises(RuntimeError) as err:
        attn_impl.require_kernel("flash_attention_2")
    assert str(err.value) == attn_impl.flash_attn_importable()


def test_extension_that_imports_passes_and_other_kernels_are_not_checked(fake_site):
    _fake_flash_attn(fake_site, "OK = True\n")
    assert attn_impl.flash_attn_importable() is None
    attn_impl.require_kernel("flash_attention_2")
    attn_impl.require_kernel("sdpa")  # no import attempted for sdpa / eager
