"""The CDI spec and the CDI names Allocate returns: every name must resolve in our own spec."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kubegpu.config import load_config
from kubegpu.inventory.spec import resolve_fake_spec
from kubegpu.kubelet import cdi
from kubegpu.kubelet.plans import all_gpus, build_plans

T4 = resolve_fake_spec("4xT4").inventory

# The kind nvidia-ctk and the GPU operator give the spec they write into /var/run/cdi.
NVIDIA_CTK_KIND = "nvidia.com/gpu"


def test_the_default_kind_is_our_own_not_the_one_nvidia_ctk_writes() -> None:
    config = load_config(None, {})
    assert config.flags.plugin.cdi_kind == "k8s.kubegpu.io/gpu"
    assert config.flags.plugin.cdi_kind != NVIDIA_CTK_KIND


@pytest.mark.parametrize("id_strategy", ["uuid", "index"])
@pytest.mark.parametrize("kind", [None, "example.com/accelerator"], ids=["default", "configured"])
def test_every_cdi_name_allocate_returns_resolves_in_the_spec_we_write(
    tmp_path: Path, id_strategy: str, kind: str | None
) -> None:
    overrides: dict[str, Any] = {
        "flags.plugin.deviceListStrategy": ["cdi-cri", "cdi-annotations"],
        "flags.plugin.deviceIDStrategy": id_strategy,
    }
    if kind is not None:
        overrides["flags.plugin.cdiKind"] = kind
    config = load_config(None, overrides)
    plugin = config.flags.plugin
    plans = build_plans(config, T4)
    spec = cdi.cdi_spec(all_gpus(plans), plugin.cdi_kind, plugin.device_id_strategy)
    path = cdi.write_spec(tmp_path, spec)

    written = json.loads(path.read_text())
    assert written["kind"] == (kind or "k8s.kubegpu.io/gpu")
    # What a CDI runtime does with a name: split off the kind, find the device in that spec.
    defined = {f"{written['kind']}={d['name']}" for d in written["devices"]}
    (plan,) = plans
    for gpus in ([T4.gpus[2]], [T4.gpus[3], T4.gpus[0]]):
        alloc = plan.allocate(config, [g.uuid for g in gpus])
        assert len(alloc.cdi_devices) == len(gpus)
        assert set(alloc.cdi_devices) <= defined
        (annotation,) = alloc.annotations.values()
        assert annotation.split(",") == list(alloc.cdi_devices)
    # The file is named after the kind, so it never replaces a spec of another kind.
    assert path == tmp_path / f"kubegpu-{written['kind'].replace('/', '-')}.json"
