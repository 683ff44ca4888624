"""Big-M-free D2H window rows of the joint model (``formulation``): they carry the LP bound.

For a start stage ``s`` (a candidate's producer) and an end stage ``w``, every copy-out
issued after Compute of ``s`` (producer at or after ``s``) and waited for before Compute of
``w`` runs on the D2H engine inside ``[A_s + c_s, A_w]``:
``A_w - A_s >= c_s + sum_m d_m (o_m - v_m(j_m+1))`` (``j_m``: the last release choice of
``m`` waited for by ``w``), so a fractional release only removes its own fraction of the
copy's time. Valid for every plan: copies are issued after their producer ends, one engine
serves them one at a time (a shared engine's prefetches only delay them), and a Wait before
Compute of ``w`` holds that Compute until the copy ends; every integral point satisfies
them, so adding them keeps the bound model's value a lower bound. A subset of a window's
copies is still a valid row, so rows are truncated at ``WINDOW_CAP`` copies.

Ends: every stage a copy-out may be waited at; starts: the producers of the ``WINDOW_BACK``
powers-of-two nearest candidates produced before the end (so a backlog from earlier copies
counts too). Windows reaching ``WINDOW_LONG`` or more producers back list every copy and
end only at ``LONG_ENDS`` stages spread over the ends, the last among them (without this
trim ResNet-152's bound LP took 111 s CPU, with it 12.9 s, at the same value).
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from outcore.policies.optimal.rows import SECONDS, Rows

if TYPE_CHECKING:
    from outcore.policies.optimal.formulation import Model

#: Most copies one window row lists (truncated windows are still valid constraints); the
#: H2D windows of ``formulation`` use the same cap.
WINDOW_CAP = 40
#: D2H windows ending at a stage start this many candidates' producers back.
WINDOW_BACK = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
#: Windows reaching at least this many producers back list every copy (no ``WINDOW_CAP``);
#: they end at ``LONG_ENDS`` stages spread over the ends, the last one among them.
WINDOW_LONG = 16
LONG_ENDS = 24


def wait_stages(model: Model, k: int) -> list[int]:
    """The stages before whose Compute ``k``'s copy-out may be waited for, by release
    choice: ``last_forward + 1`` (no release column), then each release option's."""
    c = model.p.candidates[k]
    return [c.last_forward + 1] + [model.release_stages(k, i)[1]
                                   for i in range(len(model.v[k]))]


def waited_by(model: Model, k: int, w: int) -> dict[int, float]:
    """Columns whose sum is 1 when ``k`` is offloaded and its copy-out waited for at or
    before stage ``w`` (``o_k - v_k(j+1)``, ``j`` the last release choice waited for by
    ``w``), else 0; empty when no choice waits by ``w``."""
    waits = wait_stages(model, k)
    j = bisect.bisect_right(waits, w) - 1  # choices 0..j wait by w (j = 0: at f + 1)
    if j < 0:
        return {}
    out = {model.x[k][0]: 1.0}
    if j < len(model.v[k]):
        out[model.v[k][j]] = -1.0
    return out


def add_d2h_windows(model: Model, rows: Rows, order: list[int]) -> None:
    """Add the window rows (module doc) for the candidates in ``order`` (production order)."""
    cands = model.p.candidates
    produce = [cands[k].produce for k in order]
    ends = sorted({w for k in order for w in wait_stages(model, k)})
    starts_of = sorted(set(produce))
    step = max(1, len(ends) // LONG_ENDS)
    long_ends = set(ends[::-1][::step])  # the last end (the end of forward) included
    seen: set[tuple[int, int]] = set()
    for w in ends:
        last = bisect.bisect_left(starts_of, w) - 1  # the last producer stage before w
        backs = [b for b in WINDOW_BACK if b <= last and (b < WINDOW_LONG or w in long_ends)]
        backs += [last] if w in long_ends else []
        for back in backs:
            if last - back < 0:
                break
            s = starts_of[last - back]
            cap = WINDOW_CAP if back < WINDOW_LONG else len(order)
            if (s, w) in seen:
                continue
            seen.add((s, w))
            entries: dict[int, float] = {model.A + w: 1.0, model.A + s: -1.0}
            listed = 0
            for m in order[bisect.bisect_left(produce, s):]:
                if cands[m].produce >= w or listed >= cap:
                    break
                weights = waited_by(model, m, w)
                for col, sign in weights.items():
                    entries[col] = entries.get(col, 0.0) - sign * SECONDS * cands[m].d2h
                listed += bool(weights)
            if listed:
                rows.add(entries, SECONDS * model.p.op_time[s])
