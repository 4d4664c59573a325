"""FakeLlmApi: a FAKE of the TensorRT-LLM 1.2.1 LLM API classes the engine build uses (no GPU here).

Built from ``tests/support/trtllm_api/llmapi-1.2.1.json``: each pydantic model accepts exactly the fields
the snapshot lists (strict models refuse others, as ``StrictBaseModel`` does) and starts from the
snapshot's defaults; ``LLM`` accepts only the ``TrtLlmArgs`` fields listed, checks their types,
and ``save`` writes an engine directory. What a GPU build does is not modelled.
"""

from __future__ import annotations

import enum
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

SNAPSHOT = json.loads((Path(__file__).parent / "trtllm_api" / "llmapi-1.2.1.json").read_text())


def _model(name: str) -> type:
    spec = SNAPSHOT["models"][name]

    def __init__(self, **kwargs: Any) -> None:
        unknown = set(kwargs) - set(spec["fields"])
        if unknown and spec["strict"]:
            raise ValueError(f"{name}: extra inputs are not permitted: {sorted(unknown)}")
        for field, default in spec["fields"].items():
            value = kwargs.get(field, default)
            if value == "<default PluginConfig>":
                value = PluginConfig()
            setattr(self, field, value)

    def __setattr__(self, field: str, value: Any) -> None:
        if field not in spec["fields"]:
            raise AttributeError(f"{name} has no field {field!r}")
        object.__setattr__(self, field, value)

    return type(name, (), {"__init__": __init__, "__setattr__": __setattr__, "__doc__": f"FAKE {name}"})


PluginConfig = _model("PluginConfig")
BuildConfig = _model("BuildConfig")
CalibConfig = _model("CalibConfig")
KvCacheConfig = _model("KvCacheConfig")
QuantConfig = _model("QuantConfig")
QuantAlgo = enum.Enum("QuantAlgo", {name: name for name in SNAPSHOT["enums"]["QuantAlgo"]})

TYPES = {"build_config": BuildConfig, "calib_config": CalibConfig, "kv_cache_config": KvCacheConfig,
         "quant_config": QuantConfig}


class LLM:
    """FAKE ``tensorrt_llm._tensorrt_engine.LLM``: records its arguments; ``save`` writes files."""

    instances: list[LLM] = []

    def __init__(self, **kwargs: Any) -> None:
        unknown = set(kwargs) - set(SNAPSHOT["TrtLlmArgs"]["fields"])
        if unknown:
            raise ValueError(f"TrtLlmArgs got invalid argument(s): {sorted(unknown)}")
        for field, cls in TYPES.items():
            if kwargs.get(field) is not None and not isinstance(kwargs[field], cls):
                raise TypeError(f"{field}: expected {cls.__name__}")
        if not Path(kwargs["model"]).is_dir():
            raise ValueError(f"model {kwargs['model']} is not a directory")
        self.kwargs, self.saved_to, self.shut_down = kwargs, None, False
        LLM.instances.append(self)

    def save(self, engine_dir: str) -> None:
        out = Path(engine_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps({"fake": True}))
        (out / "rank0.engine").write_bytes(b"FAKE ENGINE")
        for name in ("tokenizer.json", "tokenizer_config.json"):  # (the LLM saves its tokenizer beside the engine)
            if (Path(self.kwargs["model"]) / name).is_file():
                (out / name).write_bytes((Path(self.kwargs["model"]) / name).read_bytes())
        self.saved_to = out

    def shutdown(self) -> None:
        self.shut_down = True


def api() -> SimpleNamespace:
    """What :func:`lyre.tools.build.load_llmapi` returns, faked."""
    return SimpleNamespace(version="1.2.1", LLM=LLM, BuildConfig=BuildConfig, CalibConfig=CalibConfig,
                           KvCacheConfig=KvCacheConfig, QuantAlgo=QuantAlgo, QuantConfig=QuantConfig)
