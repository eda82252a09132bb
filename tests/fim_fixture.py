"""A tiny llama whose tokenizer has FIM tokens, and a hole's prompt ids built by hand (the tiny
tokenizer has one token per byte), for the fill-in-the-middle tests of the engine, route and Lab."""

from mlx_nb.compat.configs import write_tiny
from mlx_nb.engine.inputs.fim import FORMATS
from mlx_nb.models.templates import LENIENT_CHATML
from mlx_nb.models.tiny_tokenizer import special_id, write_tokenizer

BEFORE = "def area(r):\n    return "
AFTER = "\n\nprint(area(2.0))\n"


def fim_model(path, spelling: str):
    """A tiny llama at `path` whose tokenizer also has `spelling`'s three FIM tokens."""
    write_tiny("llama", path, 7)
    write_tokenizer(path, LENIENT_CHATML, extra=FORMATS[spelling])
    return path


def by_hand(spelling: str, before: str, after: str) -> list[int]:
    """The ids of the hole between `before` and `after` in `spelling`'s FIM tokens."""
    prefix, suffix, hole = (special_id(t, FORMATS[spelling]) for t in FORMATS[spelling])
    return [prefix, *before.encode(), suffix, *after.encode(), hole]
