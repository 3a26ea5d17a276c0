"""Weights into the model: from safetensors in a Hugging Face folder, or seeded random for shape-only configs.

Each of the model's parameters is filled from pieces of the whole model's parameter of the same name
(`Piece`): the whole of it for an unsharded model, a rank's rows or columns under tensor parallelism
(testbed.parallel.sharding). A safetensors tensor is read only where a piece needs it (`safe_open(...)
.get_slice`), and seeded weights are drawn in row chunks, so a model never holds more than its own parameters
and one chunk. Every rank draws the whole seeded stream (in chunks) and keeps its share, so a rank's seeded
weights are exactly the unsharded model's (the price: each rank spends the whole model's random draws).
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from testbed.models.arch import ModelArch

# HF name fragment -> (our fused parameter fragment, shard index)
_FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}

# seeded weights are drawn this many elements at a time (rounded to whole rows, a multiple of 16 of them: on a
# CPU, chunks of a multiple of 16 elements draw the same numbers as one draw of the whole parameter)
DRAW_CHUNK_ELEMENTS = 1 << 16


@dataclass(frozen=True)
class Piece:
    """Rows (dim 0) or columns (dim 1) [start, start + length) of the whole model's parameter, placed at
    `dest` along the same dim of this model's parameter (the other dim whole)."""

    dim: int
    start: int
    length: int
    dest: int = 0


# parameter name -> its pieces of the whole parameter; a name not listed takes the whole parameter
Slices = dict[str, list[Piece]]
# read(lo, hi, cols): rows [lo, hi) of a source (a file's tensor or a drawn chunk), columns cols=(a, b) or all
Reader = Callable[[int, int, tuple[int, int] | None], torch.Tensor]


class _Filler:
    """Copies sources into the pieces of the model's parameters that they cover, counting what it wrote."""

    def __init__(self, params: Mapping[str, torch.Tensor], whole: dict[str, torch.Size], slices: Slices):
        unknown = sorted(set(params) - set(whole))
        if unknown:
            raise ValueError(f"parameters {unknown[:5]} are not in the whole model")
        self.params, self.whole = dict(params), whole
        self.pieces = {name: slices.get(name) or [Piece(0, 0, whole[name][0])] for name in params}
        self.written = dict.fromkeys(params, 0)

    def expected(self, name: str) -> int:
        shape = self.params[name].shape
        rest = shape[1:].numel()
        return sum(p.length * (rest if p.dim == 0 else shape[0]) for p in self.pieces[name])

    def put(self, name: str, start: int, rows: int, read: Reader) -> None:
        """Rows [start, start + rows) of whole parameter `name` are readable through `read`."""
        if name not in self.params:
            return
        param = self.params[name]
        for p in self.pieces[name]:
            if p.dim == 0:
                lo, hi = max(p.start, start), min(p.start + p.length, start + rows)
                if lo < hi:
                    dest = param[p.dest + lo - p.start : p.dest + hi - p.start]
                    self._copy(name, dest, read(lo - start, hi - start, None))
            else:
                dest = param[start : start + rows, p.dest : p.dest + p.length]
                self._copy(name, dest, read(0, rows, (p.start, p.start + p.length)))

    def _copy(self, name: str, dest: torch.Tensor, src: torch.Tensor) -> None:
        if dest.shape != src.shape:
            raise ValueError(f"{name}: a piece of shape {tuple(src.shape)} for a slot of {tuple(dest.shape)}")
        dest.copy_(src)
        self.written[name] += dest.numel()

    def missing(self) -> list[str]:
        return sorted(name for name in self.params if self.written[name] < self.expected(name))


def _fused_rows(arch: ModelArch, fused_name: str, shard: int) -> tuple[int, int]:
    """Rows [start, end) of our fused parameter that the HF tensor of shard `shard` (q/k/v, gate/up) holds."""
    if "qkv_proj" in fused_name:
        q, kv = arch.num_attention_heads * arch.head_dim, arch.num_key_value_heads * arch.head_dim
        sizes = [q, kv, kv]
    else:
        sizes = [arch.intermediate_size] * 2
    start = sum(sizes[:shard])
    return start, start + sizes[shard]


@torch.no_grad()
def load_hf_weights(
    params: Mapping[str, torch.Tensor], arch: ModelArch, whole: dict[str, torch.Size], slices: Slices, folder: Path
) -> None:
    """params: the model's parameters by name; whole: the whole model's parameter shapes by name; slices: the
    pieces of them this model holds (empty: all)."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")
    filler = _Filler(params, whole, slices)
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                if name == "lm_head.weight" and arch.tie_word_embeddings:
                    continue
                if "rotary_emb" in name:
                    continue
                target, rows = name, None
                for frag, (fused, shard) in _FUSED.items():
                    if frag in name:
                        target = name.replace(frag, fused)
                        rows = _fused_rows(arch, fused, shard)
                        break
                if target not in whole:
                    raise ValueError(f"{file.name}: unexpected tensor {name!r} for this architecture")
                tensor = f.get_slice(name)
                shape = tuple(tensor.get_shape())
                start, end = rows or (0, whole[target][0])
                expect = (end - start, *whole[target][1:])
                if shape != expect:
                    raise ValueError(f"{file.name}: {name} has shape {shape}, model expects {expect}")

                def read(lo, hi, cols, tensor=tensor):
                    return tensor[lo:hi] if cols is None else tensor[lo:hi, cols[0] : cols[1]]

                filler.put(target, start, end - start, read)
    missing = filler.missing()
    if missing:
        raise ValueError(f"{folder}: weights missing for {missing[:5]}{' ...' if len(missing) > 5 else ''}")


def init_random_weights(model: torch.nn.Module, seed: int) -> None:
    """A whole model's seeded weights, in place."""
    params = dict(model.named_parameters())
    device = next(iter(params.values())).device
    draw_random_weights(params, {name: p.shape for name, p in params.items()}, {}, seed, device)


@torch.no_grad()
def draw_random_weights(
    params: Mapping[str, torch.Tensor], whole: dict[str, torch.Size], slices: Slices, seed: int, device
) -> None:
    """Seeded, scaled so activations stay finite through many layers (for speed work, not quality): one
    generator over the whole model's parameters in order (`whole`'s), each drawn in row chunks."""
    gen = torch.Generator(device=device).manual_seed(seed)
    filler = _Filler(params, whole, slices)
    for name, shape in whole.items():
        if "norm" in name or name.endswith(".bias"):
            value = torch.full(shape, 1.0 if "norm" in name else 0.0, device=device)
            filler.put(name, 0, shape[0], _reader(value))
            continue
        fan_in = shape[-1]
        step = max(16, DRAW_CHUNK_ELEMENTS // shape[1:].numel() // 16 * 16)
        for start in range(0, shape[0], step):
            rows = min(step, shape[0] - start)
            chunk = torch.randn((rows, *shape[1:]), generator=gen, device=device) * (fan_in**-0.5) * 0.5
            filler.put(name, start, rows, _reader(chunk))
    assert not filler.missing(), filler.missing()  # the whole model's draws cover every piece


def _reader(t: torch.Tensor) -> Reader:
    return lambda lo, hi, cols: t[lo:hi] if cols is None else t[lo:hi, cols[0] : cols[1]]
