"""Installed as sitecustomize.py in the SGLang oracle venv (.ci/venv_oracle_sglang.sh).

sglang.srt.configs imports torchvision at import time (deepseek_ocr.py: ``from
torchvision.transforms import InterpolationMode, functional``, and transformers' image
utilities through it); the real torchvision wants a newer torch than the CPU build the
oracle runs on. The pools and allocators never call it, so stub modules whose every
attribute is a placeholder satisfy those imports; calling a placeholder raises.
"""

import importlib.machinery
import sys
import types


class _StubMeta(type):
    def __getattr__(cls, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        return cls

    def __call__(cls, *_args: object, **_kwargs: object) -> object:
        raise RuntimeError("torchvision is a stub in the SGLang oracle venv")


class _Placeholder(metaclass=_StubMeta):
    """Any torchvision name: attribute access gives the placeholder, calls raise."""


def _attribute(name: str) -> object:
    if name.startswith("__"):  # inspect and pickle probe dunders: those stay absent
        raise AttributeError(name)
    return _Placeholder


def _module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None, is_package=True)
    module.__path__ = []
    module.__getattr__ = _attribute  # type: ignore[method-assign]
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)
    return module


if "torchvision" not in sys.modules:
    _module("torchvision").__version__ = "0.0.0+stub"
    for _name in ("transforms", "transforms.functional", "transforms.v2",
                  "transforms.v2.functional", "io", "ops", "utils", "models"):
        _module("torchvision." + _name)
