"""`headscope export DIR --to gguf --file PATH [--file-type f16|f32|q8_0]`: a checkpoint as a file another
engine runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import HeadscopeError
from ..export import verbs
from ..export.gguf import MODEL_TYPES, check_out, check_source
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
    """export converts a checkpoint folder: a loaded `model` is not used."""
    options = ExportOptions.from_namespace(args).validate()  # --to, --file-type
    out, src = Path(options.file), Path(options.model)
    check_out(out, options.force)
    check_source(src)  # everything refusable is refused before the weights load
    try:
        import gguf  # noqa: F401  (the writer; a dependency of the models extra)
    except ImportError:
        raise HeadscopeError("GGUF export needs the `gguf` package: pip install gguf") from None
    result = verbs.export(src, options)
    result.save(out, options.force)
    print("\n".join(result.lines()))
    print(f"\nwrote {out} ({out.stat().st_size:,} bytes)", file=sys.stderr)
    return 0


__all__ = ["MODEL_TYPES", "register", "run"]
