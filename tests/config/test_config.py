"""The versioned config: validation messages, precedence, and the CLI's exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kubegpu.cli.main import cli
from kubegpu.config import ConfigError, load_config, render_config

NVIDIA_STYLE = """\
version: v1
flags:
  migStrategy: none
  failOnInitError: true
  plugin:
    passDeviceSpecs: false
    deviceListStrategy: envvar
    deviceIDStrategy: uuid
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources:
      - name: nvidia.com/gpu
        replicas: 4
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_nvidia_style_file_loads_unchanged(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, NVIDIA_STYLE))
    assert cfg.flags.plugin.device_list_strategy == ["envvar"]
    assert cfg.flags.plugin.device_id_strategy == "uuid"
    ts = cfg.sharing.time_slicing
    assert ts.rename_by_default and ts.fail_requests_greater_than_one
    assert ts.resources[0].name == "nvidia.com/gpu" and ts.resources[0].replicas == 4


def test_empty_file_and_no_file_are_the_defaults(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "")) == load_config(None)
    assert load_config(None).resources.gpus[0].name == "nvidia.com/gpu"


def test_resolved_config_renders_as_one_json_line_with_nvidia_spelling() -> None:
    line = render_config(load_config(None))
    assert "\n" not in line
    assert json.loads(line)["flags"]["plugin"]["deviceIDStrategy"] == "uuid"


@pytest.mark.parametrize(
    ("text", "field", "value"),
    [
        pytest.param(
            "flags: {plugin: {deviceIDStrategy: serial}}",
            "flags.plugin.deviceIDStrategy",
            "serial",
            id="wrong-enum",
        ),
        pytest.param("flags: {migStrategy: hybrid}", "flags.migStrategy", "hybrid", id="mig"),
        pytest.param(
            "flags: {plugin: {passDeviceSpec: true}}",
            "flags.plugin.passDeviceSpec",
            "true",
            id="unknown-field",
        ),
        pytest.param(
            "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 0}]}}",
            "sharing.timeSlicing.resources.0.replicas",
            "0",
            id="replicas-zero",
        ),
        pytest.param("version: v2", "version", "v2", id="version"),
        pytest.param(
            "flags: {plugin: {deviceListStrategy: [envvar, nvlink]}}",
            "flags.plugin.deviceListStrategy.1",
            "nvlink",
            id="strategy",
        ),
        pytest.param(
            "resources: {gpus: [{pattern: '*', name: kubernetes.io/gpu}]}",
            "resources.gpus.0.name",
            "kubernetes.io/gpu",
            id="reserved-domain",
        ),
    ],
)
def test_invalid_values_name_the_field_path_and_the_value(
    tmp_path: Path, text: str, field: str, value: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text))
    assert err.value.field == field
    assert field in str(err.value)
    assert value in str(err.value)


def test_sharing_an_undeclared_resource_names_it(tmp_path: Path) -> None:
    text = "sharing: {timeSlicing: {resources: [{name: example.com/tpu, replicas: 2}]}}"
    with pytest.raises(ConfigError, match=r"resources\.0\.name: 'example.com/tpu'"):
        load_config(write(tmp_path, text))


@pytest.mark.parametrize(
    ("text", "field", "nearest"),
    [
        ("helth: {}", "helth", "'health'"),
        ("flagz: {}", "flagz", "'flags'"),
        (
            "flags: {plugin: {passDeviceSpec: true}}",
            "flags.plugin.passDeviceSpec",
            "'passDeviceSpecs'",
        ),
        (
            "sharing: {gpuShare: {slotsPerCrad: 4}}",
            "sharing.gpuShare.slotsPerCrad",
            "'slotsPerCard'",
        ),
        # A misspelt required key is unknown and missing at once: the misspelling is named.
        ("resources: {gpus: [{pattern: '*', nmae: a.b/c}]}", "resources.gpus.0.nmae", "'name'"),
    ],
)
def test_an_unknown_key_names_the_nearest_valid_one(
    tmp_path: Path, text: str, field: str, nearest: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text))
    assert err.value.field == field
    assert f"{field}: unknown field (did you mean {nearest}?)" in str(err.value)


def test_a_config_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("version: v1 # caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=rf"config file {path}: not UTF-8 text"):
        load_config(path)


def test_malformed_yaml_says_where(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"malformed YAML .* at line 3, column 2"):
        load_config(write(tmp_path, "version: v1\nflags: [a, b\nx: 1\n"))


def test_overrides_beat_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "flags: {plugin: {deviceIDStrategy: index, passDeviceSpecs: true}}")
    cfg = load_config(path, {"flags.plugin.deviceIDStrategy": "uuid"})
    assert cfg.flags.plugin.device_id_strategy == "uuid"
    assert cfg.flags.plugin.pass_device_specs  # untouched fields keep the file's value


# --- through the CLI ------------------------------------------------------------------------


def run_cli(args: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(cli, args, env=env, auto_envvar_prefix="KUBEGPU")
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("text", "field"),
    [
        pytest.param("flags: {plugin: [", "malformed YAML", id="malformed"),
        pytest.param("flags: {colour: blue}", "flags.colour", id="unknown-field"),
        pytest.param(
            "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 0}]}}",
            "sharing.timeSlicing.resources.0.replicas",
            id="replicas-zero",
        ),
    ],
)
def test_bad_config_exits_2_naming_the_field(tmp_path: Path, text: str, field: str) -> None:
    code, output = run_cli(
        [
            "device-plugin",
            "--backend",
            "fake",
            "--fake-gpus",
            "4xT4",
            "--kubelet-dir",
            str(tmp_path / "dp"),
            "--config",
            str(write(tmp_path, text)),
        ]
    )
    assert code == 2, output
    assert field in output


def test_a_bad_flag_value_from_the_environment_exits_2(tmp_path: Path) -> None:
    code, output = run_cli(
        [
            "device-plugin",
            "--backend",
            "fake",
            "--fake-gpus",
            "4xT4",
            "--kubelet-dir",
            str(tmp_path / "dp"),
        ],
        env={"KUBEGPU_DEVICE_LIST_STRATEGY": "envvar,carrier-pigeon"},
    )
    assert code == 2, output
    assert "flags.plugin.deviceListStrategy" in output and "carrier-pigeon" in output


def test_flag_beats_env_beats_file(tmp_path: Path) -> None:
    config = write(tmp_path, "flags: {plugin: {deviceIDStrategy: index, passDeviceSpecs: true}}")
    base = [
        "device-plugin",
        "--backend",
        "fake",
        "--fake-gpus",
        "no-such-preset",
        "--kubelet-dir",
        str(tmp_path / "dp"),
        "--config",
        str(config),
    ]

    def resolved(args: list[str], env: dict[str, str]) -> dict[str, object]:
        code, output = run_cli(args, env)
        assert code == 2, output  # the preset does not exist: that usage error comes later
        line = next(x for x in output.splitlines() if "resolved config" in x)
        plugin = json.loads(line.split("resolved config ", 1)[1])["flags"]["plugin"]
        return dict(plugin)

    assert resolved(base, {})["deviceIDStrategy"] == "index"  # file
    env = {"KUBEGPU_DEVICE_ID_STRATEGY": "uuid", "PASS_DEVICE_SPECS": "false"}
    from_env = resolved(base, env)
    assert from_env["deviceIDStrategy"] == "uuid"  # env beats file
    assert from_env["passDeviceSpecs"] is False  # NVIDIA's env name works too
    from_flag = resolved([*base, "--device-id-strategy", "index"], env)
    assert from_flag["deviceIDStrategy"] == "index"  # flag beats env


def test_real_process_exits_2_on_a_bad_config(tmp_path: Path) -> None:
    config = write(tmp_path, "sharing: {timeSlicing: {resources: [{name: gpu, replicas: -1}]}}")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubegpu",
            "device-plugin",
            "--backend",
            "fake",
            "--fake-gpus",
            "4xT4",
            "--kubelet-dir",
            str(tmp_path / "dp"),
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "sharing.timeSlicing.resources.0.replicas" in proc.stderr
    assert "-1" in proc.stderr


def test_the_shipped_example_config_loads() -> None:
    import kubegpu.config

    example = Path(kubegpu.config.__file__).parent / "example-config.yaml"
    cfg = load_config(example)
    assert cfg.sharing.time_slicing.resources[0].replicas == 4
    assert cfg.flags.plugin.device_list_strategy == ["envvar"]
