"""docker/cpu.Dockerfile and docker/gpu.Dockerfile, checked statically (no machine here can build
an image): what they COPY exists, every command they RUN, start or document exists in the
repository and accepts the options they pass, they run as a non-root user with a HEALTHCHECK on a
real endpoint, and the model and engine directories are volumes."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from lyre.config import LyreConfig
from tests.support.install import lyre_gpu_requirements, script_help
from tests.support.paths import REPO_ROOT

DOCKERFILES = {"cpu": REPO_ROOT / "docker" / "cpu.Dockerfile", "gpu": REPO_ROOT / "docker" / "gpu.Dockerfile"}
WORKDIR = "/app"


@dataclass
class Instruction:
    name: str
    args: str


def parse(path: Path) -> tuple[list[Instruction], list[str]]:
    """Instructions (continuation lines joined) and the comment lines."""
    instructions, comments, pending = [], [], ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comments.append(stripped.lstrip("# "))
            continue
        if not stripped:
            continue
        pending += " " + stripped.removesuffix("\\").strip()
        if not stripped.endswith("\\"):
            name, _, args = pending.strip().partition(" ")
            instructions.append(Instruction(name.upper(), args.strip()))
            pending = ""
    assert not pending, f"{path.name} ends inside a continued line"
    return instructions, comments


def exec_form(args: str) -> list[str]:
    return json.loads(args) if args.startswith("[") else shlex.split(args)


def commands(instructions: list[Instruction], comments: list[str]) -> list[list[str]]:
    """Every command the image runs: RUN steps (split at &&), CMD, the HEALTHCHECK's, and the
    ``docker run ... IMAGE python ...`` commands its comments document."""
    out: list[list[str]] = []
    for ins in instructions:
        if ins.name == "RUN":
            out += [shlex.split(part) for part in re.split(r"&&|\|", ins.args)]
        elif ins.name == "CMD":
            out.append(exec_form(ins.args))
        elif ins.name == "HEALTHCHECK":
            out.append(exec_form(ins.args[ins.args.index("CMD") + 3:].strip()))
    for text in documented_runs(comments):
        words = shlex.split(text)
        if "python" in words:
            out.append(words[words.index("python"):])
    return out


def documented_runs(comments: list[str]) -> list[str]:
    """The ``docker run ...`` commands in the comments (continuation lines joined)."""
    runs, current = [], None
    for line in comments:
        if current is None and line.startswith("docker run"):
            current = ""
        if current is not None:
            current += " " + line.removesuffix("\\").strip()
            if not line.endswith("\\"):
                runs.append(current.strip())
                current = None
    return runs


def copied(instructions: list[Instruction]) -> list[str]:
    sources = []
    for ins in instructions:
        if ins.name == "COPY":
            *src, _dest = exec_form(ins.args)
            sources += [s for s in src if not s.startswith("--")]
    return sources


@pytest.fixture(scope="module", params=sorted(DOCKERFILES))
def dockerfile(request) -> tuple[str, list[Instruction], list[str]]:
    return request.param, *parse(DOCKERFILES[request.param])


def test_every_copied_file_exists_and_the_build_context_leaves_out_local_state(dockerfile):
    _, instructions, _ = dockerfile
    sources = copied(instructions)
    assert {"pyproject.toml", "src", "protos", "config", "production_server.py", "build_engine.py"} <= set(sources)
    for src in sources:
        assert (REPO_ROOT / src).exists(), f"COPY {src}: not in the repository"
    ignored = (REPO_ROOT / ".dockerignore").read_text().split()
    assert {".venv", "models", "engines", ".git"} <= set(ignored)


def test_every_command_it_runs_exists_with_the_options_it_passes(dockerfile):
    kind, instructions, comments = dockerfile
    sources = set(copied(instructions))
    modules = {"grpc_tools.protoc": "grpcio-tools", "tensorrt_llm": "tensorrt-llm"}
    declared = {Requirement(r).name for r in lyre_gpu_requirements()}
    found_scripts = set()
    for cmd in commands(instructions, comments):
        if not cmd or cmd[0] != "python":
            continue
        if cmd[1] == "-m":
            module = cmd[2]
            if module.startswith("lyre."):
                path = REPO_ROOT / "src" / Path(*module.split("."))
                assert path.with_suffix(".py").exists() or (path / "__main__.py").exists(), module
            else:
                assert modules[module] in declared, f"python -m {module}: no dependency provides it"
            for arg in cmd[3:]:
                if arg.startswith(("protos/", "src")) and not arg.startswith("-"):
                    assert (REPO_ROOT / arg).exists(), arg
            continue
        if cmd[1] == "-c":
            continue
        script = cmd[1]
        assert (REPO_ROOT / script).is_file() and script in sources, f"{script}: not copied into the image"
        found_scripts.add(script)
        text = script_help(script)
        for flag in [a.split("=")[0] for a in cmd[2:] if a.startswith("--")]:
            assert re.search(rf"(^|\s){re.escape(flag)}\b", text), f"{script} has no option {flag}"
        for i, arg in enumerate(cmd):
            if arg == "--config":
                assert (REPO_ROOT / cmd[i + 1]).is_file() and "config" in sources
    assert "production_server.py" in found_scripts  # it starts the server
    assert "build_engine.py" in found_scripts  # and documents the engine build (or the weight fetch) as its own run
    if kind == "gpu":
        assert any("build_engine.py" in c and "--gpus all" in c for c in documented_runs(comments))


def test_it_runs_as_a_non_root_user_with_a_health_check_on_a_real_endpoint(dockerfile):
    _, instructions, _ = dockerfile
    names = [i.name for i in instructions]
    users = [i.args for i in instructions if i.name == "USER"]
    assert users and users[-1] not in ("root", "0") and names.index("USER") < names.index("CMD")
    health = next(i.args for i in instructions if i.name == "HEALTHCHECK")
    port = re.search(r"127\.0\.0\.1:(\d+)(/\w+)", health)
    assert port and port.group(2) == "/health"
    assert 'add_get("/health"' in (REPO_ROOT / "src" / "lyre" / "api" / "http" / "app.py").read_text()
    cmd = exec_form(next(i.args for i in instructions if i.name == "CMD"))
    assert cmd[cmd.index("--port") + 1] == port.group(1) and cmd[cmd.index("--host") + 1] == "0.0.0.0"
    exposed = next(i.args for i in instructions if i.name == "EXPOSE").split()
    assert {port.group(1), cmd[cmd.index("--grpc-port") + 1]} <= set(exposed)


def test_models_and_engines_are_volumes_where_the_config_puts_them(dockerfile):
    _, instructions, _ = dockerfile
    assert next(i.args for i in instructions if i.name == "WORKDIR") == WORKDIR
    volumes = set(exec_form(next(i.args for i in instructions if i.name == "VOLUME")))
    assert volumes == {f"{WORKDIR}/models", f"{WORKDIR}/engines"}
    cfg = LyreConfig()
    for path in (cfg.model.demo_dir, cfg.codec.onnx_dir):
        assert path.startswith("models/"), path
    assert cfg.build.engine_dir.startswith("engines/")
    env = " ".join(i.args for i in instructions if i.name == "ENV")
    assert f"HF_HOME={WORKDIR}/models/" in env  # downloaded weights land in the volume too


def test_the_images_start_from_the_pinned_bases():
    cpu, _ = parse(DOCKERFILES["cpu"])
    base = next(i.args for i in cpu if i.name == "FROM")
    m = re.fullmatch(r"python:(3\.\d+)-slim", base)
    assert m and m.group(1) in ("3.10", "3.11", "3.12"), base
    torch_pin = re.search(r"pip install (torch==[\w.]+) --index-url https://download\.pytorch\.org/whl/cpu",
                          " ".join(i.args for i in cpu if i.name == "RUN"))
    assert torch_pin
    ours = {Requirement(r).name: Requirement(r).specifier for r in lyre_gpu_requirements()}
    assert Version(torch_pin.group(1).removeprefix("torch==")) in ours["torch"]

    gpu, _ = parse(DOCKERFILES["gpu"])
    base = next(i.args for i in gpu if i.name == "FROM")
    trt = str(ours["tensorrt-llm"]).removeprefix("==")
    assert base == f"nvcr.io/nvidia/tensorrt-llm/release:{trt}"
    install = next(i.args for i in gpu if i.name == "RUN" and "pip install" in i.args)
    # adds only Lyre: every package the container has is a constraint (name==version, URLs too)
    assert "pip list --format=freeze" in install and "-c /tmp/container-constraints.txt" in install
