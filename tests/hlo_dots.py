"""The matmul FLOPs a compiled XLA program runs, read from its HLO text: what tests/fit/test_flops.py
holds the exact count to, and tests/objectives/test_kto_plugin.py a statistic row's cost."""

import math
import re


def hlo_dot_flops(hlo: str) -> int:
    """Sum 2 * |output| * |contracted dims| over every dot instruction of an HLO module's text (a loop's
    body counts once: callers check that none is left)."""
    shapes = {}
    for m in re.finditer(r"%(\S+) = \w+\[([\d,]*)\]", hlo):
        shapes[m.group(1)] = [int(d) for d in m.group(2).split(",") if d]
    total, n_dots = 0, 0
    for m in re.finditer(r"= \w+\[([\d,]*)\]\S* dot\(%([^,\s]+), [^)]*\).*?lhs_contracting_dims=\{([\d,]*)\}", hlo):
        out = [int(d) for d in m.group(1).split(",") if d]
        lhs = shapes[m.group(2)]
        total += 2 * math.prod(out) * math.prod(lhs[int(i)] for i in m.group(3).split(","))
        n_dots += 1
    assert n_dots == hlo.count(" dot("), "unparsed dot instructions"
    return total
