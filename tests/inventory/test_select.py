"""Backend selection: fake only when asked for, never as a silent fallback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kubegpu.core.backend import InventoryError
from kubegpu.inventory.fake import FakeGpuBackend, send_fake_gpu_command
from kubegpu.inventory.select import open_backend
from kubegpu.inventory.spec import FakeSpecError
from tests.inventory.contract import nvml_present


def test_fake_backend_is_opened_from_a_preset_with_its_control_socket(short_tmp: Path) -> None:
    control = short_tmp / "c.sock"
    backend = open_backend("fake", fake_gpus="2xV100-2xT4", fake_control=control)
    try:
        assert isinstance(backend, FakeGpuBackend)
        assert len(backend.snapshot()) == 4
        assert send_fake_gpu_command(control, "status")["ok"] is True
    finally:
        backend.close()


@pytest.mark.parametrize(
    ("kind", "options", "message"),
    [
        pytest.param("fake", {}, "needs --fake-gpus", id="fake without spec"),
        pytest.param("auto", {"fake_gpus": "4xT4"}, "only apply to --backend fake", id="auto+fake"),
        pytest.param("nvml", {"fake_control": Path("/tmp/x")}, "only apply", id="nvml+control"),
        pytest.param("magic", {}, "unknown GPU backend 'magic'", id="unknown kind"),
    ],
)
def test_settings_that_do_not_fit_together_are_rejected(
    kind: Any, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        open_backend(kind, **options)


def test_a_bad_fake_spec_is_a_spec_error() -> None:
    with pytest.raises(FakeSpecError, match="neither a preset nor a readable file"):
        open_backend("fake", fake_gpus="/nonexistent/node.yaml")


@pytest.mark.skipif(nvml_present(), reason="this node has NVML")
@pytest.mark.parametrize("kind", ["auto", "nvml"])
def test_without_nvml_no_backend_is_invented(kind: Any) -> None:
    with pytest.raises(InventoryError) as info:
        open_backend(kind)
    assert "NVML library not found" in str(info.value)
    assert ("--backend fake" in str(info.value)) is (kind == "auto")
