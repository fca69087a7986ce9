"""A gpud placement plugin: put a multi-GPU task on GPUs joined by NVLink.

A node says which of its GPUs share an NVLink domain in its ``nvlink`` label
(``[labels] nvlink = "0-1-2-3,4-5-6-7"`` in node.toml: groups separated by
commas, GPU indices inside a group by dashes). In a pool with
``gpu_placement = "nvlink"`` a task's GPUs come from one group when one has
room: the group with the fewest free GPUs that still holds the whole task,
so larger groups stay whole for larger jobs. A task no group can hold takes
the groups with the most free GPUs first. Nodes are chosen as bin-pack does
(``placement = "nvlink"`` means bin-pack over nodes, NVLink inside them);
shared GPUs (fractions) are packed as bin-pack packs them.
"""

from __future__ import annotations

from gpud import hookimpl
from gpud.policies import binpack

NAME = "nvlink"
LABEL = "nvlink"
FREE = 1.0 - 1e-9


def parse_groups(value: str, gpus: int) -> list[list[int]]:
    """The NVLink groups of a label value; GPUs the label leaves out are each a group of their own.

    Indices out of range and repeats are ignored, so a wrong label degrades
    to plain bin-packing rather than breaking placement.
    """
    groups: list[list[int]] = []
    seen: set[int] = set()
    for part in value.split(","):
        group = []
        for item in part.strip().split("-"):
            item = item.strip()
            if item.isdigit() and int(item) < gpus and int(item) not in seen:
                seen.add(int(item))
                group.append(int(item))
        if group:
            groups.append(group)
    groups.extend([i] for i in range(gpus) if i not in seen)
    return groups


def gpu_order(groups: list[list[int]], free_share: list[float], wanted: int) -> list[int]:
    """GPU indices best first for a task of ``wanted`` whole GPUs: one group that holds it, else the roomiest."""
    free = [[i for i in group if free_share[i] >= FREE] for group in groups]
    holding = [g for g in free if len(g) >= wanted]
    if holding:
        best = min(holding, key=lambda g: (len(g), g[0]))
        rest = sorted((g for g in free if g is not best), key=lambda g: (-len(g), g[0]))
    else:
        ordered = sorted(free, key=lambda g: (-len(g), g[0]))
        best, rest = ordered[0] if ordered else [], ordered[1:]
    order = list(best) + [i for g in rest for i in g]
    busy = [i for i in range(len(free_share)) if i not in set(order)]
    return order + busy


@hookimpl
def gpud_placement_strategies():
    """Offer the ``nvlink`` strategy."""
    return [NAME]


@hookimpl
def gpud_node_candidates(strategy, request, index):
    """Nodes as bin-pack orders them."""
    if strategy != NAME:
        return None
    return binpack.PLUGIN.candidates(binpack.NAME, request, index)


@hookimpl
def gpud_gpu_order(strategy, request, node):
    """GPUs of one NVLink group first for whole-GPU tasks; bin-pack order for shared GPUs and unlabelled nodes."""
    if strategy != NAME:
        return None
    label = node.labels.get(LABEL)
    if request.is_shared or not label:
        return binpack.PLUGIN.gpu_order(binpack.NAME, request, node)
    return gpu_order(parse_groups(label, node.gpus), node.free_share, request.whole_gpus)
