"""`headscope export DIR --to gguf --out PATH [--dtype f16|f32|q8_0]`: a checkpoint as a file another engine runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import HeadscopeError
from ..export.gguf import DTYPES, MODEL_TYPES, check_out, check_source, check_target, export_gguf


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export", help="write a checkpoint (original, pruned, GQA-converted) as a GGUF file for llama.cpp",
        description="Write a checkpoint folder of the llama family (SmolLM2, and what prune --save-model, "
                    "prune --unit ... --save-model or gqa wrote from one) as one GGUF file that llama.cpp, "
                    "llama-cpp-python and Ollama load. Layers of one shape give llama.cpp's `llama` architecture; "
                    "per-layer head counts, attention-free layers or FFN widths give its `deci` architecture "
                    "(per-layer arrays). MLA conversions cannot be exported (llama.cpp has no graph for them).",
        epilog="Example: headscope export out/model --to gguf --out small.gguf --dtype q8_0")
    p.add_argument("model", help="checkpoint folder (config.json, weights, tokenizer.json)")
    p.add_argument("--to", required=True, help="target format: gguf")
    p.add_argument("--out", dest="out_file", required=True, help="path of the file to write (its folder must exist)")
    p.add_argument("--dtype", default="f16",
                   help=f"weight type: {', '.join(DTYPES)} (default f16; norms stay f32; q8_0 writes f16 for "
                        f"matrices whose rows are not a multiple of 32)")
    p.add_argument("--force", action="store_true", help="replace a file already at --out")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_target(args.to, args.dtype)
    out, src = Path(args.out_file), Path(args.model)
    check_out(out, args.force)
    check_source(src)  # everything refusable is refused before the weights load
    try:
        import gguf  # noqa: F401  (the writer; a dependency of the models extra)
    except ImportError:
        raise HeadscopeError("GGUF export needs the `gguf` package: pip install gguf") from None
    info = export_gguf(src, out, dtype=args.dtype, force=args.force)
    heads = info["n_heads"]
    print(f"{src}: {info['n_layers']} layers, query heads {min(heads)}..{max(heads)} per layer, llama.cpp "
          f"architecture {info['arch']!r}, {info['dtype']}, pre-tokenizer {info['pre_tokenizer']!r}")
    if info["f16_fallback"]:
        print(f"{len(info['f16_fallback'])} tensors written f16 (rows not a multiple of 32): "
              f"{', '.join(info['f16_fallback'][:4])}{' ...' if len(info['f16_fallback']) > 4 else ''}")
    print(f"\nwrote {out} ({info['bytes']:,} bytes)", file=sys.stderr)
    return 0


__all__ = ["MODEL_TYPES", "register", "run"]
