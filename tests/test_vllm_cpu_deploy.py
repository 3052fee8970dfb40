"""rtc-omni's CPU mode for the vLLM engine, the parts that need no vLLM: which deploy settings a
model directory gets on CPU, what `--device` refuses, and how stage processes start
(rtc_omni/engines/vllm_cpu/)."""

from __future__ import annotations

import importlib.util
import json
import multiprocessing.forkserver
import subprocess
from pathlib import Path

import pytest

from rtc_omni.config import Settings, SettingsError, load_settings
from rtc_omni.engines.vllm_cpu import activate
from rtc_omni.engines.vllm_cpu.deploy import CPU_STAGE, cpu_deploy_config, model_type
from rtc_omni.engines.vllm_cpu.stage_processes import PreloadedContext, fork_stages_from_preloaded_server
from rtc_omni.engines.vllm_runtime import EngineUnavailable, on_device

SHIPPED = Path("/opt/vllm_omni/deploy")  # stands for vLLM-Omni's deploy directory


def model(tmp_path: Path, name: str, config: dict | None = None, diffusers: bool = False) -> Path:
    path = tmp_path / name
    path.mkdir()
    if config is not None:
        (path / "config.json").write_text(json.dumps(config))
    if diffusers:
        (path / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline"}))
    return path


def test_qwen25_omni_gets_every_stage_on_cpu_in_float32(tmp_path: Path) -> None:
    path = cpu_deploy_config(str(model(tmp_path, "q", {"model_type": "qwen2_5_omni"})), SHIPPED)
    assert path is not None
    deploy = json.loads(path.read_text())  # YAML reads JSON
    assert deploy["base_config"] == str(SHIPPED / "qwen2_5_omni.yaml")  # vLLM-Omni's stages, connectors, defaults
    assert deploy["dtype"] == "float32"
    assert [stage["stage_id"] for stage in deploy["stages"]] == [0, 1, 2]
    for stage in deploy["stages"]:
        assert stage["devices"] == "0" and stage["enforce_eager"] and not stage["async_scheduling"]
        assert stage["gpu_memory_utilization"] <= 0.1  # a fraction of host RAM on CPU, per stage
        assert stage["engine_extras"]["kv_cache_memory_bytes"] == CPU_STAGE["engine_extras"]["kv_cache_memory_bytes"]


def test_qwen3_omni_gets_bfloat16_and_vllms_cpu_moe(tmp_path: Path) -> None:
    path = cpu_deploy_config(str(model(tmp_path, "q3", {"model_type": "qwen3_omni_moe"})), SHIPPED)
    assert path is not None
    deploy = json.loads(path.read_text())
    assert deploy["base_config"].endswith("qwen3_omni_moe.yaml") and deploy["dtype"] == "bfloat16"
    assert all(stage["moe_backend"] == "auto" for stage in deploy["stages"])


def test_the_same_settings_are_written_once(tmp_path: Path) -> None:
    first = cpu_deploy_config(str(model(tmp_path, "a", {"model_type": "qwen2_5_omni"})), SHIPPED)
    second = cpu_deploy_config(str(model(tmp_path, "b", {"model_type": "qwen2_5_omni"})), SHIPPED)
    assert first == second and first is not None and first.is_file()


def test_diffusion_pipelines_hub_ids_and_unknown_layouts_need_none(tmp_path: Path) -> None:
    wan = model(tmp_path, "wan", {"_class_name": "WanPipeline"}, diffusers=True)
    assert model_type(str(wan)) is None and cpu_deploy_config(str(wan), SHIPPED) is None
    assert cpu_deploy_config("Qwen/Qwen2.5-Omni-7B", SHIPPED) is None
    assert cpu_deploy_config(str(model(tmp_path, "llama", {"model_type": "llama"})), SHIPPED) is None
    assert cpu_deploy_config(str(model(tmp_path, "broken")), SHIPPED) is None
    (tmp_path / "broken" / "config.json").write_text("{not json")
    assert model_type(str(tmp_path / "broken")) is None


def test_without_vllms_cpu_build_the_plugin_stays_out_and_device_cpu_is_refused() -> None:
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here; tests/test_vllm_contract.py checks the CPU platform with it")
    assert activate() is None  # vLLM-Omni's own platforms apply
    with pytest.raises(EngineUnavailable, match="--device cpu needs vLLM's CPU build"):
        on_device(Settings(engine="vllm", model="m", device="cpu"))
    settings = Settings(engine="vllm", model="m")
    assert on_device(settings) is settings  # auto, GPU: nothing changes


def test_device_is_a_flag_and_a_variable() -> None:
    assert load_settings(environ={"RTC_OMNI_DEVICE": "cpu"}).device == "cpu"
    with pytest.raises(SettingsError, match="--device"):
        load_settings(environ={"RTC_OMNI_DEVICE": "tpu"})


def test_a_stage_process_runs_with_the_environment_it_was_started_in(monkeypatch: pytest.MonkeyPatch) -> None:
    # A fork server's children inherit the server's environment; vLLM-Omni sets per-stage variables
    # just before each start, so a stage process carries them (rtc_omni/engines/vllm_cpu/stage_processes.py).
    multiprocessing.forkserver.ensure_running()  # started before the variable is set, as in a server
    monkeypatch.setenv("RTC_OMNI_STAGE_PROBE", "set before the start")
    check = ["sh", "-c", 'test "$RTC_OMNI_STAGE_PROBE" = "set before the start"']
    process = PreloadedContext().Process(target=subprocess.check_call, args=(check,))
    process.start()
    process.join(timeout=60)
    assert process.exitcode == 0


def test_a_chosen_start_method_keeps_vllm_omnis_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    assert fork_stages_from_preloaded_server() is False
