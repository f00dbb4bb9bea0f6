"""`headscope export DIR --to gguf --file PATH [--file-type f16|f32|q8_0]`: a checkpoint as a file another
engine runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import HeadscopeError
from ..export.gguf import MODEL_TYPES, check_out, check_source, check_target, export_gguf
from ..export.options import ExportOptions
from ..models.adapter import HeadModel
from ..options.cli import verb_parser


def register(sub: argparse._SubParsersAction) -> None:
    p = verb_parser(
        sub, "export", ExportOptions,
        help="write a checkpoint (original, pruned, GQA-converted) as a GGUF file for llama.cpp",
        description="Write a checkpoint folder of the llama family (SmolLM2, and what prune --save-model, "
                    "prune --unit ... --save-model or gqa wrote from one) as one GGUF file that llama.cpp, "
                    "llama-cpp-python and Ollama load. Layers of one shape give llama.cpp's `llama` architecture; "
                    "per-layer head counts, attention-free layers or FFN widths give its `deci` architecture "
                    "(per-layer arrays). MLA conversions cannot be exported (llama.cpp has no graph for them).",
        epilog="Example: headscope export out/model --to gguf --file small.gguf --file-type q8_0",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace, model: HeadModel | None = None) -> int:
    check_target(args.to, args.file_type)
    out, src = Path(args.file), Path(args.model)
    check_out(out, args.force)
    check_source(src)  # everything refusable is refused before the weights load
    try:
        import gguf  # noqa: F401  (the writer; a dependency of the models extra)
    except ImportError:
        raise HeadscopeError("GGUF export needs the `gguf` package: pip install gguf") from None
    info = export_gguf(src, out, dtype=args.file_type, force=args.force)
    heads = info["n_heads"]
    print(f"{src}: {info['n_layers']} layers, query heads {min(heads)}..{max(heads)} per layer, llama.cpp "
          f"architecture {info['arch']!r}, {info['dtype']}, pre-tokenizer {info['pre_tokenizer']!r}")
    if info["f16_fallback"]:
        print(f"{len(info['f16_fallback'])} tensors written f16 (rows not a multiple of 32): "
              f"{', '.join(info['f16_fallback'][:4])}{' ...' if len(info['f16_fallback']) > 4 else ''}")
    print(f"\nwrote {out} ({info['bytes']:,} bytes)", file=sys.stderr)
    return 0


__all__ = ["MODEL_TYPES", "register", "run"]
