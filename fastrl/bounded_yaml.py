"""YAML read with bounds: config files, tune spaces and saved configs are small, so a document over ``MAX_CHARS``,
one that expands (through aliases) to more than ``MAX_NODES`` nodes, a recursive alias and a mapping that gives a key
twice are refused before anything is built from them (``yaml.YAMLError`` with one line, which callers report).

PyYAML builds an alias as a reference, so a "billion laughs" document loads in microseconds and blows up only when
something walks it (printing an error message, say); the node count here is taken on the composed graph, each shared
node counted once per reference, with memoization, so the check itself is linear in the document.
"""
from __future__ import annotations

import yaml

MAX_CHARS = 1 << 20  # 1 MiB of text: a tuned config is about 2 KB
MAX_NODES = 100_000  # nodes after alias expansion: a config has a few hundred


class YAMLBoundsError(yaml.YAMLError):
    """A document over the bounds, or one giving a key twice."""


def safe_load(text: str):
    """``yaml.safe_load(text)`` within the bounds above (else ``YAMLBoundsError``)."""
    if len(text) > MAX_CHARS:
        raise YAMLBoundsError(f"the document has {len(text):,} characters, over the limit of {MAX_CHARS:,}")
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, {}, set())
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _expanded_size(node, sizes: dict, open_nodes: set) -> int:
    """Nodes under ``node`` with every alias expanded; raises past ``MAX_NODES``, on a cycle or a duplicate key."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_nodes:
        raise YAMLBoundsError(f"a recursive alias at line {node.start_mark.line + 1}; write the value out")
    open_nodes.add(key)
    if isinstance(node, yaml.MappingNode):
        children = [part for pair in node.value for part in pair]
        seen = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                if key_node.value in seen:
                    raise YAMLBoundsError(f"the key {key_node.value[:80]!r} is given twice (line "
                                          f"{key_node.start_mark.line + 1}); keep one")
                seen.add(key_node.value)
    elif isinstance(node, yaml.SequenceNode):
        children = node.value
    else:
        children = []
    total = 1
    for child in children:
        total += _expanded_size(child, sizes, open_nodes)
        if total > MAX_NODES:
            raise YAMLBoundsError(f"the document expands (through its aliases) to over {MAX_NODES:,} values, near "
                                  f"line {node.start_mark.line + 1}; write a config without alias bombs")
    open_nodes.discard(key)
    sizes[key] = total
    return total
