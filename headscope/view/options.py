"""The options of `headscope view` and of `headscope.view(hm, text, options)`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import HeadscopeError
from ..options import ModelOptions, OptionError, option
from ..table import parse_head

__all__ = ["DEFAULT_MAX_TOKENS", "MAX_TOKENS_CAP", "ViewOptions"]

DEFAULT_MAX_TOKENS = 512
# one head's map at this length is 8192^2 floats (256 MiB): the most the view will hold
MAX_TOKENS_CAP = 8192


@dataclass(frozen=True, kw_only=True)
class ViewOptions(ModelOptions):
    """`headscope view`: a local page to type text and see any head's attention beside its measured evidence."""

    from_dirs: tuple[str, ...] = option((), "a folder holding analyze, roles, score, kvcache or patch outputs, or a "
                                            "study folder (repeatable; earlier folders win)",
                                        flag="--from", metavar="DIR", append=True, reads=True)
    port: int = option(8000, "port to listen on (default 8000; 0: any free port)", at_least=0, at_most=65535)
    host: str = option("127.0.0.1", "address to listen on (default 127.0.0.1: this machine only; anything else "
                                    "exposes the model to the network)")
    open: bool = option(False, "open the page in the default browser")
    max_tokens: int = option(DEFAULT_MAX_TOKENS, f"longest text a request may send, in tokens (default "
                                                 f"{DEFAULT_MAX_TOKENS})", at_least=1, at_most=MAX_TOKENS_CAP)
    # Not a command-line option: the heads a notebook view draws first (the page lets you click any head).
    heads: tuple[str, ...] = field(default=(), metadata={
        "help": "heads drawn first, at most two side by side, written L3H7 (default: head 0 of the first layer "
                "with heads)"})

    def check(self) -> None:
        super().check()
        if not isinstance(self.from_dirs, (tuple, list)) or not all(isinstance(d, (str, Path)) for d in self.from_dirs):
            raise OptionError("from_dirs", f"is {self.from_dirs!r}; give a list of folders")
        if not isinstance(self.heads, (tuple, list)) or not all(isinstance(h, str) for h in self.heads):
            raise OptionError("heads", f"is {self.heads!r}; give head names such as ('L1H4',) or ('L0H0', 'L1H2')")
        if not self.host.strip():
            raise OptionError("host", "is empty; give an address to listen on, e.g. 127.0.0.1 (this machine only)")
        if len(self.heads) > 2:
            raise OptionError("heads", f"lists {len(self.heads)} heads ({', '.join(self.heads)}); the view draws one "
                                       f"or two heads side by side")
        for h in self.heads:
            try:
                parse_head(h)
            except HeadscopeError as e:
                raise OptionError("heads", str(e)) from None
        for d in self.from_dirs:
            if not str(d).strip():  # Path('') is the current folder: never read it by accident
                raise OptionError("from_dirs", "is empty text; give a folder holding other verbs' outputs")
            p = Path(d)
            if p.is_file():
                raise OptionError("from_dirs", f"{str(p)!r} is a file; it takes the folder holding a verb's "
                                               f"outputs: give {str(p.parent)!r}")
            if not p.is_dir():
                raise OptionError("from_dirs", f"{str(p)!r} does not exist; give a folder holding other verbs' "
                                               f"outputs")
