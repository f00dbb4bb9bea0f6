"""The options of `headscope export`."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import OptionError, did_you_mean
from ..io import check_writable_file
from ..options import Options, option

TARGETS = ("gguf",)
DTYPES = ("f16", "f32", "q8_0")


def check_target(to: str, dtype: str) -> None:
    """Refuse an unknown target format `to` or weight type `file_type` (before anything loads)."""
    if to not in TARGETS:
        raise OptionError("to", f"{to!r} is not a format headscope exports{did_you_mean(to, TARGETS)}; "
                                f"choose one of {', '.join(TARGETS)}")
    if dtype not in DTYPES:
        raise OptionError("file_type", f"{dtype!r} is not one of {', '.join(DTYPES)}{did_you_mean(dtype, DTYPES)}")


@dataclass(frozen=True, kw_only=True)
class ExportOptions(Options):
    """`headscope export`: a checkpoint written as a GGUF file for llama.cpp."""

    model: str = option(None, "checkpoint folder (config.json, weights, tokenizer.json)",
                        positional=True, required=True, reads=True)
    to: str = option(None, "target format: gguf", required=True)
    file: str = option(None, "path of the file to write (its folder must exist)",
                       old=("--out",), required=True, whole=True)
    file_type: str = option("f16", "weight type in the file: f16, f32, q8_0 (default f16; norms stay f32; q8_0 "
                                   "writes f16 for matrices whose rows are not a multiple of 32)", old=("--dtype",))
    force: bool = option(False, "replace a file already at --file")

    def check(self) -> None:
        super().check()
        check_target(self.to, self.file_type)

    def check_paths(self) -> None:
        super().check_paths()
        if self.file is not None:
            check_writable_file(self.file, "file")
