"""What a branch's distribution is, as data: the mask and score functions of one
attention branch (in the spirit of attention-gym's ``mask_mod`` and ``score_mod``,
functions of the batch ``b``, head ``h``, query index ``q_idx`` and key index
``kv_idx`` plus a few captured tensors), which every kernel reads instead of a
``Tq x Tk`` mask or bias.

Shape notation as in :mod:`.attention`: B = batch size, H = heads, Tq = query length,
Tk = key length, R = 2K + 1 relative-position buckets. Queries are bottom-right
aligned: query ``q_idx`` sits at key index ``q' = q_idx + Tk - Tq`` (:mod:`.context`),
and ``d = kv_idx - q'`` is the index distance, which equals the real-position distance
wherever a result is used (:func:`~.context.distance_table`).

A branch describes itself once (:meth:`~.context.AttentionBranch.describe`) as a
:class:`Description`:

* ``window``: a :class:`Window` ``(left, right)``, the mask function ``-left <= d <=
  right`` (``None``: unbounded on that side): Xu et al. 2019, eq. 3; Song et al. 2019,
  eq. 9-11;
* ``scores``: additive score terms, each a score function of ``(b, h, q_idx, kv_idx)``
  and its captured tensors: :class:`GaussianScore` (Yang et al. 2018, eq. 5, centre
  ``P`` and width ``sigma = D / 2`` per query), :class:`BucketScore` (Shaw et al.
  2018, eq. 4, the key term: a table of 2K + 1 values per query, read at bucket
  ``clip(d, -K, K) + K``) and :class:`DenseScore` (a whole bias, e.g. the finite part
  of a float ``attn_mask``);
* ``mask``: a boolean mask given whole (True = blocked), for what is neither: a window
  over real positions where queries are not key positions.

The call adds its own (:class:`CallDescription`): padding (``key_padding_mask[b,
kv_idx]``), causality (``d <= 0``) and Shaw et al.'s value term (:class:`ValueTerm`).

Each piece evaluates itself densely (``dense``), which is the eager reference's bias
or mask exactly, and the kernels evaluate it their own way: per block of query rows
(:mod:`.kernels.recompute`), as a band, or inside a fused kernel's ``score_mod``
(:mod:`.kernels.flex`).
"""
from dataclasses import dataclass, field
from typing import Callable, Optional, Tuple

import torch
from torch import Tensor


@dataclass(frozen=True)
class Window:
    """Keep the keys with ``-left <= d <= right`` (``d = kv_idx - q'``); None: unbounded."""

    left: Optional[int]
    right: Optional[int]

    def blocked(self, distance: Tensor) -> Optional[Tensor]:
        """True where ``distance`` (``j - i``, any shape) lies outside the window; None
        when nothing is blocked."""
        blocked = None
        if self.left is not None:
            blocked = distance < -self.left
        if self.right is not None:
            too_far = distance > self.right
            blocked = too_far if blocked is None else blocked | too_far
        return blocked

    def causal(self) -> "Window":
        """The window with the causal bound ``d <= 0`` applied."""
        return Window(self.left, 0 if self.right is None else min(self.right, 0))

    @property
    def bounded(self) -> bool:
        return self.left is not None or self.right is not None


@dataclass(frozen=True)
class Prologue:
    """A score term's tensors as a function of the call's queries, for a fused call to
    compute within itself: ``function(q, *tensors, *flags)`` gives ``(values, stats)``,
    ``values`` the term's tensors (:class:`GaussianScore`'s P and sigma,
    :class:`BucketScore`'s table) and ``stats`` a tensor of what the branch logs, or
    None; ``report`` takes the stats. ``q`` is the branch's queries (``B x H x Tq x
    Dh``, unscaled); ``flags`` are Python constants."""

    function: Callable
    q: Tensor
    tensors: Tuple[Optional[Tensor], ...]
    flags: Tuple[object, ...]
    report: Optional[Callable[[Tensor], None]] = None

    def run(self, q: Tensor):
        """``(values, stats)`` for the queries ``q``."""
        return self.function(q, *self.tensors, *self.flags)


class _Given:
    """A score term whose tensors are given, or computed by a :class:`Prologue` when
    first read (outside any kernel, the prologue's stats reported then); a fused call
    that takes the prologue (:mod:`.kernels.flex`) computes them within itself
    instead, and they are never read outside it."""

    def __init__(self, values: Optional[tuple], prologue: Optional[Prologue]):
        if prologue is None and (values is None or any(v is None for v in values)):
            raise ValueError(f"{type(self).__name__} needs its tensors, or a prologue that computes them")
        self._values, self.prologue = values, prologue

    @property
    def computed(self) -> bool:
        """Whether the term's tensors exist (given, or their prologue run)."""
        return self._values is not None

    def values(self) -> tuple:
        """The term's tensors, computed by the prologue on first reading."""
        if self._values is None:
            self._values, stats = self.prologue.run(self.prologue.q)
            if stats is not None and self.prologue.report is not None:
                self.prologue.report(stats)
        return self._values


class GaussianScore(_Given):
    """Yang et al. (2018), eq. 5: ``G = -(k_pos[b, kv_idx] - P[b, h, q_idx])^2 /
    (2 sigma[b, h, q_idx]^2)``.

    ``centre`` P and ``sigma`` (= D / 2) are ``B x H x Tq`` (float32, or float64);
    ``k_pos``, the real key positions, ``B' x Tk`` in their dtype. A fused kernel gets
    ``coeff = -1 / (2 sigma^2)`` computed outside its score function
    (:meth:`coefficient`), so it reads two captured tensors per query, once each. P
    and sigma may be given by a :class:`Prologue` instead (:meth:`predicted`)."""

    def __init__(self, centre: Optional[Tensor], sigma: Optional[Tensor], k_pos: Tensor,
                 prologue: Optional[Prologue] = None):
        super().__init__(None if centre is None and sigma is None else (centre, sigma), prologue)
        self.k_pos = k_pos

    @classmethod
    def predicted(cls, prologue: Prologue, k_pos: Tensor) -> "GaussianScore":
        """The term whose P and sigma ``prologue`` computes."""
        return cls(None, None, k_pos, prologue)

    @property
    def centre(self) -> Tensor:
        return self.values()[0]

    @property
    def sigma(self) -> Tensor:
        return self.values()[1]

    def dense(self) -> Tensor:
        """G, ``B x H x Tq x Tk`` (the eager reference's bias)."""
        k_pos = self.k_pos[:, None, None, :]
        return -((k_pos - self.centre.unsqueeze(-1)) ** 2) / (2.0 * self.sigma.unsqueeze(-1) ** 2)

    def block_term(self):
        """G as a bias term of :func:`~.kernels.recompute.recomputed_attention`:
        ``(fn, (P, sigma, k_pos))``, ``fn`` giving the rows ``i0 .. i1 - 1`` from the
        tensors it is given (autograd's leaves in the backward pass)."""
        return gaussian_rows, (self.centre, self.sigma, self.k_pos)

    def coefficient(self) -> Tensor:
        """``-1 / (2 sigma^2)``, ``B x H x Tq``."""
        return gaussian_coefficient(self.sigma)

    @staticmethod
    def call_values(centre: Tensor, sigma: Tensor) -> Tuple[Tensor, Tensor]:
        """What a fused call reads of the term: P and ``-1 / (2 sigma^2)``."""
        return centre, gaussian_coefficient(sigma)


def gaussian_coefficient(sigma: Tensor) -> Tensor:
    """``-1 / (2 sigma^2)``: :class:`GaussianScore`'s coefficient of ``d^2``."""
    return -0.5 / (sigma * sigma)


def gaussian_rows(inputs, i0: int, i1: int) -> Tensor:
    """Rows ``i0 .. i1 - 1`` of :class:`GaussianScore`'s G from ``(P, sigma, k_pos)``:
    ``d^2 * (-1 / (2 sigma^2))``, one pass per product over the block."""
    centre, sigma, k_pos = inputs[0][..., i0:i1, None], inputs[1][..., i0:i1, None], inputs[2]
    d = k_pos[:, None, None, :] - centre
    return (d * d) * gaussian_coefficient(sigma)


class BucketScore(_Given):
    """Shaw et al. (2018), eq. 4's key term: ``table[b, h, q_idx, clip(d, -K, K) + K]``,
    ``table`` = ``q_i w^K_r / sqrt(Dh)`` (``B x H x Tq x R``), given or computed by a
    :class:`Prologue`."""

    def __init__(self, table: Optional[Tensor], k: int, prologue: Optional[Prologue] = None):
        super().__init__(None if table is None else (table,), prologue)
        self.k = k

    @property
    def table(self) -> Tensor:
        return self.values()[0]

    def bucket(self, tgt_len: int, src_len: int, device) -> Tensor:
        """``clip(d, -K, K) + K``, ``Tq x Tk`` (long)."""
        pos = torch.arange(src_len - tgt_len, src_len, device=device).unsqueeze(1)
        return (torch.arange(src_len, device=device).unsqueeze(0) - pos).clamp(-self.k, self.k) + self.k

    def dense(self, src_len: int) -> Tensor:
        """The term for every pair, ``B x H x Tq x Tk``."""
        index = self.bucket(self.table.size(-2), src_len, self.table.device)
        return torch.gather(self.table, -1, index.expand(*self.table.shape[:-1], src_len))

    @staticmethod
    def call_values(table: Tensor) -> Tuple[Tensor]:
        """What a fused call reads of the term: the table."""
        return (table,)


@dataclass(frozen=True)
class DenseScore:
    """A bias given whole, broadcastable to ``B x H x Tq x Tk``."""

    bias: Tensor

    def dense(self) -> Tensor:
        return self.bias


@dataclass(frozen=True)
class ValueTerm:
    """Shaw et al. (2018), eq. 3: ``z_i += sum_j alpha_ij w^V_{clip(d, -K, K) + K}``,
    ``embeddings`` ``(2K + 1) x Dh``."""

    embeddings: Tensor
    k: int


@dataclass
class Description:
    """One branch's distribution: its window, its score terms and any mask given whole
    (see the module docstring). An empty description is the global branch."""

    window: Optional[Window] = None
    scores: Tuple[object, ...] = ()
    mask: Optional[Tensor] = None

    def dense_bias(self, src_len: int) -> Optional[Tensor]:
        """The sum of the score terms (``B' x H' x Tq x Tk``), or None."""
        bias = None
        for term in self.scores:
            value = term.dense(src_len) if isinstance(term, BucketScore) else term.dense()
            bias = value if bias is None else bias + value
        return bias


@dataclass
class CallDescription:
    """What a call adds to every branch: ``key_padding_mask`` (``B x Tk``, True at
    padding, or None), ``causal`` (``d <= 0``), the call's own score terms (Shaw et
    al.'s key term, the finite part of a float ``attn_mask``), its own mask given whole
    (a boolean ``attn_mask``, True = blocked) and Shaw et al.'s value term."""

    key_padding_mask: Optional[Tensor]
    causal: bool
    scores: Tuple[object, ...] = ()
    mask: Optional[Tensor] = None
    value: Optional[ValueTerm] = None
    extra: dict = field(default_factory=dict)
