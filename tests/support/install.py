"""pyproject.toml's requirements against TensorRT-LLM 1.2.1's published ones, and the scripts' options."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import sys
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from tests.support.paths import REPO_ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SNAPSHOT = REPO_ROOT / "src" / "lyre" / "gpucheck" / "tensorrt-llm-1.2.1-requires.json"  # (what gpucheck checks against)


GPU_PYTHONS = ("3.10", "3.12")  # TensorRT-LLM 1.2.1's wheels; setup.sh installs the trt extra only there


def intersects(a: SpecifierSet, b: SpecifierSet) -> bool:
    """Whether some version satisfies both. Each set is a union of intervals whose ends are the
    versions its clauses name, so testing every named version and a version just above each one
    (and the extremes) finds a common one when there is any."""
    points = {Version("0"), Version("100000")}
    for spec in [*a, *b]:
        try:
            v = Version(spec.version.removesuffix(".*"))
        except InvalidVersion:
            continue
        points |= {v, Version(".".join(map(str, (*v.release, 0, 0, 0, 1))))}  # v, and just above it
        if v.post is None and v.dev is None:
            points.add(Version(f"{v}.post1"))
        if spec.version.endswith(".*"):  # the next release after a prefix: 1.2.* -> 1.3
            release = list(v.release)
            release[-1] += 1
            points.add(Version(".".join(map(str, release))))
    return any(a.contains(p, prereleases=True) and b.contains(p, prereleases=True) for p in points)


def requirements_for(python: str, reqs: list[str], extras: tuple[str, ...] = ("",)) -> dict[str, SpecifierSet]:
    """name -> combined specifier of the requirements that apply on Linux x86_64 under ``python``."""
    env = {**default_environment(), "python_version": python, "python_full_version": f"{python}.0",
           "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"}
    out: dict[str, SpecifierSet] = {}
    for text in reqs:
        r = Requirement(text)
        if r.marker is not None and not any(r.marker.evaluate({**env, "extra": e}) for e in extras):
            continue
        name = canonicalize_name(r.name)
        out[name] = out.get(name, SpecifierSet()) & r.specifier
    return out


def lyre_gpu_requirements() -> list[str]:
    """What setup.sh installs on a GPU machine: the dependencies and the dev and trt extras."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["dev"],
            *project["optional-dependencies"]["trt"]]



@functools.cache
def script_help(script: str) -> str:
    """What ``python SCRIPT --help`` prints, for the options the images and manifests pass it: the
    script's ``main`` in-process (each script runs as a process elsewhere in the suite), once per
    script for the whole run."""
    spec = importlib.util.spec_from_file_location(f"script_{Path(script).stem}", REPO_ROOT / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out, argv0 = io.StringIO(), sys.argv[0]
    sys.argv[0] = script  # (argparse's default program name)
    try:
        with contextlib.redirect_stdout(out):
            module.main(["--help"])
    except SystemExit as e:
        assert e.code in (0, None), f"{script} --help exited {e.code}"
    finally:
        sys.argv[0] = argv0
    return out.getvalue()
